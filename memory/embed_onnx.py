"""The ONNX Runtime backends of the sentence-transformers embedder (`onnx`, `onnx-int8`), exported offline.

No model is downloaded: on first use the local sentence-transformers model (by default the packaged
all-MiniLM-L6-v2) is loaded with torch once and exported to ONNX into the embedder cache
(`Settings.embed_cache_dir`, default `~/.cache/mnemo`), in a folder named after the model and a
fingerprint of its weights file (size, mtime, first MiB), so a reinstalled model is exported anew:

    <cache>/embed/<model>-<fingerprint>/model.onnx          fp32 graph: tokens -> mean-pooled embedding
                                        model_qint8.onnx    the same, int8 dynamic quantization
                                        tokenizer.json      the model's fast tokenizer
                                        meta.json           max_seq_length, dim, inputs, versions

Later processes (and Dask workers) only read these files; they need `onnxruntime` and `tokenizers`,
not torch. Files are written under a temporary name and renamed, so concurrent first uses are safe;
delete the folder to re-export. `onnx-int8` is ONNX Runtime's dynamic quantization (int8 weights,
per output channel; activations quantized at run time), which ONNX Runtime runs with integer kernels
on CPU.

The graph is exported with torch's TorchScript exporter and quantized with
`onnxruntime.quantization.quantize_dynamic` directly: sentence-transformers' own `backend="onnx"`
goes through `optimum-onnx`, whose releases do not support transformers 5. Texts are tokenized with
the model's own tokenizer (truncated to its `max_seq_length`), sorted by length and encoded in
batches of `batch_size`, like `SentenceTransformer.encode`. Only mean-pooling models are supported.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from memory.errors import ConfigError, OptionalDependencyError

log = logging.getLogger(__name__)

#: bump when the exported graph changes, so old caches are not reused
EXPORT_VERSION = 1
FILES = {"onnx": "model.onnx", "onnx-int8": "model_qint8.onnx"}
DEFAULT_CACHE = "~/.cache/mnemo"
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def export_dir(model_path: str, cache_dir: str) -> Path:
    """The cache folder for this model's exported files (depends on the weights file, not on its path)."""
    src = Path(model_path)
    weights = next((src / n for n in ("model.safetensors", "pytorch_model.bin") if (src / n).exists()), None)
    if weights is None:
        raise ConfigError(f"the onnx embedder needs a local sentence-transformers model folder: {model_path!r}",
                          model_path=model_path)
    stat = weights.stat()
    key = f"{EXPORT_VERSION}:{weights.name}:{stat.st_size}:{stat.st_mtime_ns}:{_head_hash(weights)}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    name = src.name if src.name != "model" else src.parent.name
    return Path(os.path.expanduser(cache_dir or DEFAULT_CACHE)) / "embed" / f"{name}-{digest}"


def _head_hash(path: Path, size: int = 1 << 20) -> str:
    """A hash of the first MiB (with the size and mtime: cheap, and it changes when the weights file does)."""
    with path.open("rb") as fh:
        return hashlib.sha256(fh.read(size)).hexdigest()


_export_lock = threading.Lock()


def ensure_exported(model_path: str, cache_dir: str, backend: str) -> Path:
    """Export (once) the model's ONNX file for `backend`; returns its path."""
    if backend not in FILES:
        raise ConfigError(f"not an onnx embedder backend: {backend!r}", backend=backend)
    out = export_dir(model_path, cache_dir)
    target = out / FILES[backend]
    if target.exists() and (out / "meta.json").exists():
        return target
    with _export_lock:
        if not (out / FILES["onnx"]).exists() or not (out / "meta.json").exists():
            _export_fp32(model_path, out)
        if backend == "onnx-int8" and not target.exists():
            _quantize(out / FILES["onnx"], target)
    return target


def _write_atomic(path: Path, write: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _export_fp32(model_path: str, out: Path) -> None:
    """torch -> ONNX: the transformer plus mean pooling, with dynamic batch and sequence axes."""
    try:
        import onnx  # noqa: F401  (the exporter needs it)
        import torch
    except ImportError as exc:
        raise OptionalDependencyError("onnx", "onnx") from exc
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    log.info("exporting %s to ONNX in %s (once)", model_path, out)
    st = SentenceTransformer(model_path, device="cpu")
    modules = [type(m).__name__ for m in st]
    pooling: Any = st[1] if len(st) > 1 else None
    mode = getattr(pooling, "pooling_mode", None) or getattr(pooling, "get_pooling_mode_str", lambda: None)()
    if modules[:2] != ["Transformer", "Pooling"] or set(modules[2:]) - {"Normalize"} or mode != "mean":
        raise ConfigError(f"the onnx embedder supports Transformer + mean Pooling models only, not {modules}",
                          model_path=model_path)
    transformer: Any = st[0].auto_model
    transformer.eval()
    tokenizer = st.tokenizer
    wrapped = _mean_pooled_class()(transformer).eval()
    sample = tokenizer(["an example sentence", "a second, longer example sentence"], padding=True,
                       return_tensors="pt")
    names = [n for n in INPUTS if n in sample]
    axes = {n: {0: "batch", 1: "sequence"} for n in names} | {"sentence_embedding": {0: "batch"}}
    out.mkdir(parents=True, exist_ok=True)

    def export(tmp: Path) -> None:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(wrapped, tuple(sample[n] for n in names), str(tmp), input_names=names,
                              output_names=["sentence_embedding"], dynamic_axes=axes, opset_version=17,
                              dynamo=False)

    _write_atomic(out / FILES["onnx"], export)
    _write_atomic(out / "tokenizer.json", lambda tmp: tokenizer.backend_tokenizer.save(str(tmp)))
    dim = getattr(st, "get_embedding_dimension", st.get_sentence_embedding_dimension)()
    meta = {"source": str(model_path), "export_version": EXPORT_VERSION, "dim": int(dim or 0),
            "max_seq_length": int(st.max_seq_length or 512), "inputs": names,
            "pad_token_id": int(tokenizer.pad_token_id or 0), "pad_token": str(tokenizer.pad_token),
            "torch": torch.__version__}  # meta.json is written last: its presence marks a complete export
    _write_atomic(out / "meta.json", lambda tmp: tmp.write_text(json.dumps(meta, indent=1)))


def _mean_pooled_class() -> type:
    import torch

    class MeanPooled(torch.nn.Module):
        """The transformer's token embeddings averaged over the attention mask (sentence-transformers' Pooling)."""

        def __init__(self, transformer: torch.nn.Module) -> None:
            super().__init__()
            self.transformer = transformer

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
            kwargs = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
            tokens = self.transformer(input_ids=input_ids, attention_mask=attention_mask, **kwargs)[0]
            mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
            return (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)

    return MeanPooled


def _quantize(src: Path, target: Path) -> None:
    """int8 dynamic quantization: int8 weights per output channel, uint8 activations scaled at run time."""
    try:
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as exc:
        raise OptionalDependencyError("onnxruntime", "onnx") from exc
    log.info("quantizing %s to int8", src)
    _write_atomic(target, lambda tmp: quantize_dynamic(str(src), str(tmp), weight_type=QuantType.QInt8,
                                                       per_channel=True, extra_options={"DefaultTensorType": 1}))


class OnnxModel:
    """An exported model: tokenizer + ONNX Runtime session; `encode` returns unnormalized pooled rows."""

    def __init__(self, model_file: Path, threads: int = 0) -> None:
        try:
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise OptionalDependencyError("onnxruntime", "onnx") from exc
        folder = model_file.parent
        self.meta = json.loads((folder / "meta.json").read_text())
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(int(self.meta["max_seq_length"]))
        self.tokenizer.enable_padding(pad_id=int(self.meta["pad_token_id"]), pad_token=str(self.meta["pad_token"]))
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])

    @property
    def dim(self) -> int:
        return int(self.meta["dim"])

    def encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            idx = order[start:start + batch_size]
            enc = self.tokenizer.encode_batch([texts[i] for i in idx])
            ids = np.array([e.ids for e in enc], dtype=np.int64)
            feed = {"input_ids": ids, "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64)}
            if "token_type_ids" in self.meta["inputs"]:
                feed["token_type_ids"] = np.array([e.type_ids for e in enc], dtype=np.int64)
            out[idx] = self.session.run(None, feed)[0]  # InferenceSession.run is thread-safe
        return out
