"""llama.cpp (``llama-cpp-python``) as a peer of ``bench_decoding.py --compare-engines``; runs inside
the peer's own venv (docs/engines.md). Reads one JSON job on stdin, prints one JSON line.

Job: gguf (the GGUF the embedded model ships: SmolLM2's is Q4_1, so this peer reads 4-bit weights
where the others read bf16), prompts {category: [[ids]]}, new_tokens, threads, variant ("plain", or
"prompt_lookup": llama-cpp-python's prompt-lookup decoding with its CPU setting of 2 predicted
tokens). Greedy (temperature 0, top_k 1), EOS suppressed by a logit bias so every prompt yields
new_tokens, the context reset before every prompt (no reuse of the previous prompt's prefix)."""
import json
import sys
import time


def main():
    job = json.loads(sys.stdin.read())
    import llama_cpp
    from llama_cpp import Llama

    kw = dict(model_path=job["gguf"], n_ctx=2048, n_threads=job["threads"], n_threads_batch=job["threads"],
              seed=0, verbose=False)
    if job["variant"] == "prompt_lookup":
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        kw["draft_model"] = LlamaPromptLookupDecoding(num_pred_tokens=2)
    t0 = time.perf_counter()
    llm = Llama(**kw)
    no_eos = {llm.token_eos(): -1e9}
    first = next(iter(job["prompts"].values()))[0]
    llm.create_completion(prompt=first, max_tokens=8, temperature=0.0, top_k=1)  # warm-up
    startup = time.perf_counter() - t0
    results = {}
    for category, prompts in job["prompts"].items():
        tokens = seconds = 0
        outs = []
        for ids in prompts:
            llm.reset()
            t = time.perf_counter()
            out = llm.create_completion(prompt=ids, max_tokens=job["new_tokens"], temperature=0.0, top_k=1,
                                        logit_bias=no_eos)
            seconds += time.perf_counter() - t
            n = out["usage"]["completion_tokens"]
            tokens += n
            outs.append(out["choices"][0]["text"][:200])
        results[category] = {"tokens": tokens, "seconds": seconds, "outputs": outs}
    print(json.dumps({"engine": f"llama-cpp-python {llama_cpp.__version__}", "startup_s": startup,
                      "results": results}), flush=True)


if __name__ == "__main__":
    main()
