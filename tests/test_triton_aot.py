"""Every Triton kernel the launchers pick compiles for sm_80 and sm_90 (no GPU) as the JIT compiles
it, within its budget (shared memory; no spills in tree_attention's table); the GPU report's
occupancy arithmetic and binary parsing."""
import pytest

from specops import extension, kernel_resources
from specops.triton_kernels import aot
from specops.triton_kernels import tree_attention as ta

SO = kernel_resources.cuda_so_path()
needs_so = pytest.mark.skipif(SO is None, reason="CUDA extension not built here (specops/_C_cuda*.so)")
MODULES = {"kv_compact", "linear", "sampling", "token_bitmask", "topn", "tree_attention", "tree_mask", "verify",
           "verify_logits"}


@pytest.fixture(scope="module")
def rows():
    """One AOT compile of every case for both archs (a subprocess: this one runs interpreted)."""
    return aot.collect_in_subprocess((80, 90))[0]


def test_every_kernel_compiles_within_its_budget(rows):
    bad = [aot._line(r) for r in rows if r["problems"]]
    assert not bad, "\n".join(bad)
    assert {r["arch"] for r in rows} == {80, 90}
    assert {r["module"] for r in rows} == MODULES
    for r in rows:
        assert r["regs"] > 0 and r["smem"] <= aot.SMEM_PER_BLOCK[r["arch"]]


def test_float_arguments_typed_fp64_compile(rows):
    # Inside a torch.compile graph inductor passes a Python float to a traced Triton launch as fp64
    # (the JIT: fp32); tree_attention's qk_scale once widened its accumulators and failed to compile
    # there (the H200 run of 2026-11-28). Each kernel taking a float compiles typed so, on both archs.
    wide = {(r["kernel"], r["arch"]) for r in rows if r["case"].endswith("(float args fp64)")}
    assert {("_tree_attention_kernel", 80), ("_tree_attention_kernel", 90)} <= wide


def _ta_row(rows, arch, name, kernel="_tree_attention_kernel"):
    got = [r for r in rows if r["module"] == "tree_attention" and r["case"] == name and r["arch"] == arch
           and r["kernel"] == kernel]
    assert len(got) == 1, (arch, name, kernel, len(got))
    return got[0]


@pytest.mark.parametrize("tag", ["", "paged "])
def test_tree_attention_every_table_entry_compiles_spill_free_within_its_shared_memory(rows, tag):
    # The launcher's table is the one compiled: each entry's warps, stages, tiles, D = 256 included; table
    # 80 within the 99 KB of sm_86 / sm_89 / sm_120. The paged variant (page-table K/V rows): same budgets.
    n = 0
    for arch, table in ta.CONFIGS.items():
        limit = ta.SMEM_SMALL if arch == 80 else ta.SMEM_BIG
        for wide, by_d in table.items():
            for bd, (decode, block) in by_d.items():
                if tag:
                    decode, block = ta.PAGED_CONFIGS.get((arch, wide, bd), (decode, block))
                for cfg, cls in ((decode, "decode"), (block, "block")):
                    for split in ("", " split") if cls == "decode" or bd == 256 else ("",):
                        r = _ta_row(rows, arch, f"{tag}{'float32' if wide else 'bfloat16'} D{bd} {cls}{split}")
                        assert (r["num_warps"], r["num_stages"]) == (cfg.num_warps, cfg.num_stages)
                        assert {f"BLOCK_M={cfg.block_m}", f"BLOCK_N={cfg.block_n}", f"BLOCK_D={bd}",
                                f"SPLIT={bool(split)}", f"PAGED={bool(tag)}"} <= set(r["config"].split())
                        assert r["spills"] == 0 and r["smem"] <= limit, r
                        if split:
                            assert _ta_row(rows, arch, r["case"], "_combine_kernel")["spills"] == 0
                        n += 1
    assert n == 2 * 2 * (3 * 2 + 3 + 1)  # archs x dtypes x (decode split/not, block, D 256 block split)


def test_aot_specialises_as_the_jit_does(rows):
    # Hints come from the launch's own arguments: 16-aligned pointers, strides and sizes get
    # tt.divisibility, ints equal to 1 become constants, ints that are not multiples of 16 stay plain.
    r = _ta_row(rows, 90, "bfloat16 D256 block")
    for name in ("q_ptr", "k_ptr", "v_ptr", "out_ptr", "mask_ptr", "prefix_ptr", "D", "S", "sk_s", "sv_s", "Tq"):
        assert name in r["aligned"], name
    assert {"s_pre=1", "s_blk=1", "s_ql=1", "sm_w=1", "NS=1", "G=4"} <= set(r["config"].split())
    decode = _ta_row(rows, 90, "bfloat16 D256 decode split")  # Tq = 4, B = 1, 4 splits
    assert "Tq" not in decode["aligned"] and "NS" not in decode["aligned"]
    assert {"B=1", "N_M=1"} <= set(decode["config"].split())
    kv = [r for r in rows if r["module"] == "kv_compact"][0]
    assert {"k_ptr", "v_ptr", "S", "D"} <= set(kv["aligned"])
    paged = [r for r in rows if r["module"] == "kv_compact" and r["case"].startswith("paged ")]
    assert len(paged) == 2 * 3 * 2 and all("PAGED=True" in r["config"].split() for r in paged)
    assert all("pt_ptr" in r["aligned"] for r in paged)


def test_report_table_lists_every_triton_row(rows):
    text = kernel_resources.table(kernel_resources.triton_rows((80, 90), rows))
    lines = text.splitlines()
    assert len(lines) == len(rows) + 1 and lines[0].split()[:4] == ["kind", "kernel", "config", "arch"]
    assert "tree_attention._tree_attention_kernel" in text and "sm_80" in text and "sm_90" in text


@pytest.mark.parametrize("arch, regs, threads, smem, want", [
    (90, 128, 128, 0, (4, "regs")),  # 4096 registers a warp: 16 warps
    (80, 255, 256, 0, (1, "regs")),  # 255 rounds to 256 a thread: 8 warps
    (90, 16, 1024, 0, (2, "threads")),
    (80, 32, 128, 100000, (1, "smem")),  # 167936 // (100000 + 1024 reserved)
    (90, 32, 128, 116736, (2, "smem")),  # 233472 // 116736 (sm_90 cubins count the reserve)
    (80, 32, 128, 170000, (0, "smem")),  # over the per-block opt-in limit: cannot launch
    (90, 8, 32, 0, (32, "blocks")),
])
def test_occupancy(arch, regs, threads, smem, want):
    assert kernel_resources.occupancy(arch, regs, threads, smem) == want


def test_cuda_binary_parsing():
    usage = """
Fatbin elf code:
================
arch = sm_80
Resource usage:
 Common:
  GLOBAL:28 CONSTANT[4]:224
 Function _ZN7specops12_GLOBAL__N_114combine_kernelIfEEvNS0_4ArgsE:
  REG:32 STACK:8 SHARED:0 LOCAL:0 CONSTANT[0]:488 TEXTURE:0 SURFACE:0 SAMPLER:0
"""
    rows = aot.parse_resource_usage(usage)
    assert rows == [{"arch": "sm_80", "function": "_ZN7specops12_GLOBAL__N_114combine_kernelIfEEvNS0_4ArgsE",
                     "REG": 32, "STACK": 8, "SHARED": 0, "LOCAL": 0, "CONSTANT[0]": 488, "TEXTURE": 0,
                     "SURFACE": 0, "SAMPLER": 0}]
    elf = "arch = sm_90\n.nv.info._Z1kv\n\tAttribute:\tEIATTR_MAX_THREADS\n\tFormat:\tEIFMT_SVAL\n\tValue:\t0x80 0x1 0x1 \n"
    assert kernel_resources._max_threads(elf) == {("sm_90", "_Z1kv"): 128}
    assert kernel_resources._split_name(
        "void specops::(anonymous namespace)::tree_attention_kernel<c10::BFloat16, 8>(specops::Args)") == (
        "tree_attention_kernel", "<BFloat16, 8>")


@needs_so
def test_cuda_rows_of_the_built_extension():
    rows = kernel_resources.cuda_rows(SO, (80, 90))
    kernels = {r["kernel"] for r in rows}
    assert {"tree_attention_kernel", "combine_kernel", "kv_compact_kernel"} <= kernels
    assert all(r["regs"] > 0 for r in rows)
    assert all(r["threads"] for r in rows)  # launch bounds or CUDA_LAUNCH give every block size
    tc = [r for r in rows if r["kernel"] == "tree_attention_tc_kernel"]
    # every <T, DP, Paged, Inv> instantiation has its CUDA_LAUNCH entry: dynamic smem counted
    assert tc and all(not r["problems"] and r["smem"] >= kernel_resources._tc_smem(64) for r in tc)
    assert {r["config"].rsplit(", ", 1)[1] for r in tc} == {"false>", "true>"}
    assert all(kernel_resources.INV_NOTE in r["detail"] for r in tc if r["config"].endswith(", true>"))
    assert kernel_resources.invariant_extra_smem(4, 1000) == 32 * 4 // 4 * 16
    assert kernel_resources.invariant_extra_smem(64, 1001) == 251 * 16


# Stack bytes (spills or local arrays) the CUDA kernels may use per (kernel, config prefix); every
# other kernel must use none. The D = 256 tensor-core kernel holds 128 fp32 O registers per thread.
CUDA_STACK_ALLOWANCE = {("tree_attention_tc_kernel", "<BFloat16, 256"): 64, ("tree_attention_tc_kernel", "<Half, 256"): 64,
                        ("tree_attention_kernel", "<float, 4,"): 16}


@needs_so
def test_cuda_kernels_within_budget():
    # The archs this extension was built for (TORCH_CUDA_ARCH_LIST: 8.0;9.0 by default; a GPU machine's
    # own build may hold only its arch) that the budgets know.
    built = {int(a[3:]) for a in extension.cuda_archs()} or {80, 90}
    archs = built & set(kernel_resources.ARCH)
    assert archs, f"no budget for the built archs {sorted(built)}"
    rows = kernel_resources.cuda_rows(SO, tuple(sorted(archs)))
    assert {r["arch"] for r in rows} == archs
    assert any(r["kernel"] == "tree_attention_tc_kernel" for r in rows)
    for r in rows:
        allowed = max([v for (k, c), v in CUDA_STACK_ALLOWANCE.items() if r["kernel"] == k and r["config"].startswith(c)],
                      default=0)
        assert r["spills"] <= allowed, f"{r['kernel']} {r['config']} sm_{r['arch']}: {r['spills']} B of stack"
        assert r["smem"] <= kernel_resources.ARCH[r["arch"]]["smem_block"], f"{r['kernel']} {r['config']}: {r['smem']} B"
        assert r["regs"] <= 255
        if r["kernel"] == "tree_attention_tc_kernel":  # resident blocks per SM from the compiler's figures
            blocks, _ = kernel_resources.occupancy(r["arch"], r["regs"], r["threads"], r["smem"])
            assert blocks >= (1 if ", 256," in r["config"] else 3), (r["config"], r["arch"], blocks)
