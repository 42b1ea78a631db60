"""One rank of the tensor-parallel tests (tests/test_tp.py runs it under torchrun; not collected): loads
the tiny targets the test saved, sharded over the torchrun world (transformers' DistributedConfig), and
a replicated draft, runs every case of ``cases.json`` and writes ``rank<R>.json``: per case the
generated token lists, or the error raised."""
import argparse
import functools
import json
import os

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM, DistributedConfig

    import specops
    from specops.decoding.api import _LOADED

    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    with open(os.path.join(args.dir, "cases.json")) as f:
        cases = json.load(f)

    @functools.cache
    def model(name, sharded):
        kw = {"distributed_config": DistributedConfig(tp_size=world)} if sharded else {}
        path = os.path.join(args.dir, name)
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kw).eval()

    out = {}
    for case in cases:
        kw = dict(case["kw"])
        env = kw.pop("env", {})
        seed = kw.pop("seed_per_rank", None)
        if seed is not None:
            kw["seed"] = seed + rank
        if kw.pop("skew_costs", False):
            # Fixed step costs that make rank 0 speculate and every other rank prefer AR steps: the
            # ranks run the same blocks only if they take rank 0's budgets.
            from specops.decoding import AdaptiveConfig

            draft_cost = (lambda g: 0.001 * g) if rank == 0 else (lambda g: 100.0 * g)
            kw["adaptive"] = AdaptiveConfig(target_cost=lambda T: 1.0 + 0.01 * T, draft_cost=draft_cost)
        os.environ.update(env)
        try:
            if case.get("by_path"):  # generate loads the target itself (tp_size from the torchrun world)
                _LOADED.clear()
                target = os.path.join(args.dir, case["target"])
            else:
                target = model(case["target"], True)
            draft = model(case["draft"], False) if case.get("draft") else None
            toks, m = specops.generate(target, case["prompts"], draft=draft, **kw)
            out[case["id"]] = {"tokens": [toks[b, : m.lengths[b]].tolist() for b in range(toks.shape[0])],
                               "budget_steps": m.num_budget_steps, "ar_steps": m.num_ar_steps}
        except Exception as err:  # recorded: the test checks which cases must raise, and how
            out[case["id"]] = {"error": f"{type(err).__name__}: {err}"}
        finally:
            for k in env:
                os.environ.pop(k, None)
    with open(os.path.join(args.dir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    if torch.distributed.is_initialized():  # a group left to the interpreter's exit once aborted a rank
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
