"""Which engine a run builds: ``engine.backend`` — 'torch' (``TorchEngine``: any Hugging Face
causal LM on the CPU) or 'vllm' (``VLLMEngine``: CUDA GPUs). Plain data, so a Ray engine
actor can build the same engine from it in its own process."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlonce.model.precision import wants_autocast


@dataclass(frozen=True, kw_only=True)
class EngineSpec:
    backend: str
    model_dir: str
    dtype: str = "float32"
    lm_head_fp32: bool = True
    max_batch_size: int = 128
    batch_wait_s: float = 0.01
    seed: int = 0
    threads: int = 1
    gpu_memory_utilization: float = 0.5
    max_model_len: int | None = None
    tensor_parallel_size: int = 1
    continuous: bool = True
    prefix_cache_mb: float = 1024
    autocast: bool = False
    compile_solo: bool = False
    fast_path: bool = True
    lora_rank: int = 0
    """``model.lora.rank``: a vLLM engine is started with LoRA enabled and takes each publish's adapter."""
    rollout_quant: str = "none"
    """``model.rollout_quant``: 'mxfp4' samples from quantize-dequantized experts (torch engine)."""

    @classmethod
    def from_config(cls, cfg, model_dir: str | Path) -> EngineSpec:
        e, m = cfg.engine, cfg.model
        return cls(backend=e.backend, model_dir=str(model_dir), dtype=m.dtype, lm_head_fp32=m.lm_head_fp32,
                   max_batch_size=e.max_batch_size, batch_wait_s=e.batch_wait_s, seed=cfg.runtime.seed,
                   threads=cfg.runtime.rollout_threads, gpu_memory_utilization=e.gpu_memory_utilization,
                   max_model_len=e.max_model_len, tensor_parallel_size=e.tensor_parallel_size,
                   continuous=e.continuous, prefix_cache_mb=e.prefix_cache_mb, autocast=wants_autocast(m.autocast),
                   compile_solo=e.compile_solo, fast_path=e.fast_path,
                   lora_rank=m.lora.rank, rollout_quant=m.rollout_quant)

    def check(self) -> None:
        """Raise ``BackendMissing`` now if this engine's backend is not installed: a run checks
        before SFT, not after it."""
        if self.backend == "vllm":
            from rlonce.engine.base import BackendError
            from rlonce.engine.vllm_engine import require_vllm

            if self.rollout_quant != "none":
                raise BackendError(f"model.rollout_quant = {self.rollout_quant!r} is the torch engine's; with vLLM "
                                   "serve an MXFP4 checkpoint instead, or set model.rollout_quant = 'none'")
            require_vllm()

    def build(self, index: int = 0, *, lm=None, version: int = 0):
        """Engine ``index`` of the run (its seed is offset by the index); ``lm`` reuses an already
        loaded model and tokenizer (the torch backend copies nothing: pass a copy if the caller
        trains the original)."""
        from rlonce.model import loader

        seed = self.seed + 7919 * index
        if self.backend == "vllm":
            from rlonce.engine.vllm_engine import VLLMEngine

            lm = lm or loader.load(self.model_dir, weights=False)
            return VLLMEngine(self.model_dir, dtype=self.dtype, gpu_memory_utilization=self.gpu_memory_utilization,
                              max_model_len=self.max_model_len, seed=seed, version=version,
                              tensor_parallel_size=self.tensor_parallel_size, eos_token_ids=lm.eos_token_ids,
                              lm_head_fp32=self.lm_head_fp32, lora_rank=self.lora_rank)
        import torch

        from rlonce.engine.torch_engine import TorchEngine

        if lm is None:
            torch.set_num_threads(self.threads)
            lm = loader.load(self.model_dir, dtype=self.dtype, lm_head_fp32=self.lm_head_fp32, autocast=self.autocast)
        pad = lm.tokenizer.pad_token_id
        return TorchEngine(lm.model, eos_token_ids=lm.eos_token_ids, pad_token_id=pad if pad is not None else 0,
                           max_batch_size=self.max_batch_size, batch_wait_s=self.batch_wait_s, seed=seed,
                           version=version, continuous=self.continuous, prefix_cache_mb=self.prefix_cache_mb,
                           threads=self.threads, compile_solo=self.compile_solo and self.fast_path,
                           fast_decode=self.fast_path, native_kernels=self.fast_path, tokenizer=lm.tokenizer,
                           rollout_quant=self.rollout_quant)

    def __call__(self, index: int):
        return self.build(index)
