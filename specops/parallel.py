"""Tensor parallelism: what a target sharded by transformers changes for specops. Each rank's KV cache
holds its local KV heads (:func:`local_kv_heads`; docs/scaling.md §What each rank holds) and every
host decision is the group's first rank's (:class:`RankGroup`; §One decision for all ranks)."""
import os
import zlib

import torch

CHECK_ENV = "SPECOPS_CHECK_RANKS"


def tp_size(model):
    """The tensor-parallel degree transformers sharded ``model`` with (1: not sharded)."""
    return int(getattr(model, "_tp_size", None) or 1)


def text_config(model):
    cfg = model.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def local_kv_heads(model, cfg=None):
    """The KV heads this rank holds: the config's ``num_key_value_heads`` divided by the TP size when
    the model's plan shards the key projection column-wise (ValueError if it does not divide), else all."""
    cfg = cfg or text_config(model)
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    n = tp_size(model)
    if n <= 1:
        return kv
    plan = getattr(model, "tp_plan", None) or {}
    if not any(name.rsplit(".", 1)[-1] in ("k_proj", "qkv_proj", "query_key_value") and style == "colwise"
               for name, style in plan.items()):
        return kv  # the keys are not sharded: every rank holds them all
    for what, count in (("num_attention_heads", heads), ("num_key_value_heads", kv)):
        if count % n:
            raise ValueError(f"tensor parallelism: the model's {what} ({count}) does not divide evenly by the "
                             f"tensor-parallel size ({n}); choose a tp_size that divides both "
                             f"num_attention_heads ({heads}) and num_key_value_heads ({kv})")
    return kv // n


def check_placement(model, what="target"):
    """A model split across devices by accelerate's ``device_map`` (pipeline placement) is not
    supported: every layer's cache and kernels run on one device per rank."""
    device_map = getattr(model, "hf_device_map", None) or {}
    devices = {str(d) for d in device_map.values()}
    if len(devices) > 1:
        raise ValueError(f"{what}: a model whose layers sit on several devices through device_map "
                         f"({sorted(devices)}) is not supported; shard it with tensor parallelism instead "
                         f"(from_pretrained(..., distributed_config=DistributedConfig(tp_size=N)) under torchrun, "
                         f"or generate(..., tp_size=N); docs/scaling.md)")


def env_world_size():
    """WORLD_SIZE as torchrun sets it (1 outside torchrun)."""
    try:
        return max(int(os.environ.get("WORLD_SIZE", "1")), 1)
    except ValueError:
        return 1


class RankGroup:
    """The ranks of one tensor-parallel target, which must take every host decision together.
    ``agree(value)``: the group's first rank's int, on every rank (one broadcast); ``check_step(step,
    seqs)``: with ``check``, RuntimeError naming the step and the ranks whose emitted tokens differ
    (one all-gather of a digest per step)."""

    def __init__(self, group=None, check=None):
        import torch.distributed as dist

        self.dist, self.group = dist, group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        self.src = dist.get_global_rank(group, 0) if group is not None else 0
        # gloo reduces host tensors; NCCL needs them on this rank's GPU.
        self.device = torch.device("cuda", torch.cuda.current_device()) \
            if dist.get_backend(group) == "nccl" else torch.device("cpu")
        self.check = os.environ.get(CHECK_ENV, "0") not in ("", "0") if check is None else bool(check)

    @classmethod
    def for_model(cls, model, check=None):
        """The group of ``model``'s tensor-parallel shards, or None for a model on one device."""
        if tp_size(model) <= 1:
            return None
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("a tensor-parallel model needs an initialised torch.distributed process group")
        group = None
        manager = getattr(model, "_mesh_manager", None)
        if manager is not None:
            try:
                group = manager.get_mesh("tp").get_group()
            except Exception:  # an older mesh manager: the whole world is the TP group
                group = None
        return cls(group, check)

    def agree(self, value):
        t = torch.tensor([int(value)], dtype=torch.int64, device=self.device)
        self.dist.broadcast(t, src=self.src, group=self.group)
        return int(t.item())

    def check_step(self, step, seqs):
        if not self.check:
            return
        digest = 0
        for s in seqs:
            digest = zlib.crc32(torch.tensor(s, dtype=torch.int64).numpy().tobytes(), digest)
        mine = torch.tensor([digest], dtype=torch.int64, device=self.device)
        every = [torch.zeros_like(mine) for _ in range(self.size)]
        self.dist.all_gather(every, mine, group=self.group)
        values = [int(x.item()) for x in every]
        if len(set(values)) > 1:
            odd = [r for r, v in enumerate(values) if v != values[0]]
            raise RuntimeError(f"tensor-parallel ranks diverged at decode step {step}: the emitted tokens of "
                               f"rank(s) {odd} differ from rank 0's (token digests {values}; this is rank "
                               f"{self.rank}). Every host decision must be identical on every rank (docs/scaling.md)")
