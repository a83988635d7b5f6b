"""The embedder backends: torch is unchanged; onnx and onnx-int8 are exported once, offline, from the
packaged all-MiniLM-L6-v2 into a cache folder and agree with torch; vectors of two embedders are not mixed."""
from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from memory.embed import (
    Embedder,
    SentenceTransformerEmbedder,
    check_vectors_match,
    embedder_for,
    get_embedder,
    packaged_model_path,
)
from memory.errors import ConfigError, EmbedderMismatchError, MnemoError, UnknownBackendError
from memory.settings import Settings, load_settings

SENTENCES = [
    "Caroline went to the LGBTQ support group yesterday and found it really powerful.",
    "Melanie is planning a camping trip with her kids next month.",
    "What did you think of the pottery class?",
    "ok",
    "I have been painting landscapes lately, mostly sunsets over the lake near our house. " * 30,  # > 256 tokens
    "The adoption agency called back about the interview on Friday!",
    "Do you still run every morning before work?",
]


@pytest.fixture(scope="module")
def torch_vectors(embedder: Embedder) -> np.ndarray:
    return embedder.embed(SENTENCES)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("embed-cache"))


def test_torch_backend_is_unchanged(embedder: Embedder, torch_vectors: np.ndarray) -> None:
    emb = embedder_for(Settings())
    assert Settings().embed_backend == "torch"
    assert isinstance(emb, SentenceTransformerEmbedder) and emb.backend == "torch"
    assert emb.model_name == embedder.model_name == "all-MiniLM-L6-v2"
    assert emb.dim == 384
    np.testing.assert_array_equal(emb.embed(SENTENCES), torch_vectors)


def test_backend_setting_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MNEMO_EMBED_BACKEND", "onnx-int8")
    monkeypatch.setenv("MNEMO_EMBED_CACHE_DIR", "/tmp/somewhere")
    settings = load_settings()
    assert settings.embed_backend == "onnx-int8" and settings.embed_cache_dir == "/tmp/somewhere"
    with pytest.raises(ValueError):
        Settings(embed_backend="tensorflow")  # type: ignore[arg-type]


def test_model_name_differs_per_backend_and_bad_backends_are_refused() -> None:
    names = {b: SentenceTransformerEmbedder(backend=b).model_name for b in ("torch", "onnx", "onnx-int8")}
    assert names == {"torch": "all-MiniLM-L6-v2", "onnx": "all-MiniLM-L6-v2+onnx",
                     "onnx-int8": "all-MiniLM-L6-v2+onnx-int8"}
    with pytest.raises(UnknownBackendError):
        SentenceTransformerEmbedder(backend="tensorflow")
    with pytest.raises(ConfigError, match="cpu only"):
        get_embedder(device="cuda", backend="onnx")


@pytest.mark.parametrize("backend, floor", [("onnx", 0.98), ("onnx-int8", 0.9)])
def test_onnx_backends_agree_with_torch(backend: str, floor: float, cache_dir: str,
                                        torch_vectors: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing may come from the network
    settings = Settings(embed_backend=backend, embed_cache_dir=cache_dir, embed_batch_size=3)  # type: ignore[arg-type]
    emb = embedder_for(settings)
    assert emb.model_name == f"all-MiniLM-L6-v2+{backend}" and emb.dim == 384
    vecs = emb.embed(SENTENCES)
    assert vecs.shape == (len(SENTENCES), 384) and vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    cosines = (vecs * torch_vectors).sum(axis=1)
    assert cosines.min() > floor, cosines
    # rows keep their order through length-sorted batches; a text's vector barely depends on its batch
    # (int8: activations are quantized with one scale per batch, so it does a little)
    alone = np.vstack([emb.embed([s]) for s in SENTENCES])
    assert ((alone * vecs).sum(axis=1) > (0.9999 if backend == "onnx" else floor)).all()
    # exported once, into the cache folder, never next to the packaged model
    files = {p.name for p in Path(cache_dir).rglob("*") if p.is_file()}
    assert {"model.onnx", "tokenizer.json", "meta.json"} <= files
    assert not any(p.suffix == ".onnx" for p in Path(packaged_model_path()).rglob("*"))


def test_export_happens_once(cache_dir: str) -> None:
    pytest.importorskip("onnxruntime")
    from memory.embed_onnx import ensure_exported

    first = ensure_exported(packaged_model_path(), cache_dir, "onnx-int8")
    stamp = first.stat().st_mtime_ns
    assert ensure_exported(packaged_model_path(), cache_dir, "onnx-int8") == first
    assert first.stat().st_mtime_ns == stamp
    with pytest.raises(ConfigError):
        ensure_exported(packaged_model_path(), cache_dir, "torch")


def test_vectors_of_two_embedders_are_not_mixed() -> None:
    torch_emb = SentenceTransformerEmbedder()
    int8 = SentenceTransformerEmbedder(backend="onnx-int8")
    check_vectors_match(None, int8)  # nothing recorded yet
    check_vectors_match("all-MiniLM-L6-v2", torch_emb)
    with pytest.raises(EmbedderMismatchError) as err:
        check_vectors_match("all-MiniLM-L6-v2", int8)
    assert isinstance(err.value, ConfigError) and isinstance(err.value, MnemoError)
    assert "'all-MiniLM-L6-v2'" in str(err.value) and "'all-MiniLM-L6-v2+onnx-int8'" in str(err.value)
    again = pickle.loads(pickle.dumps(err.value))
    assert str(again) == str(err.value) and again.recorded == "all-MiniLM-L6-v2"


@pytest.mark.parametrize("model", ["/nonexistent/model", "@@bad@@"])
def test_a_model_that_cannot_load_is_a_config_error_naming_the_setting(model: str) -> None:
    with pytest.raises(ConfigError, match="MNEMO_EMBED_MODEL") as err:
        SentenceTransformerEmbedder(model=model).embed(["hello"])
    assert model in str(err.value)


def test_only_the_packaged_model_is_named_after_it(tmp_path: Path) -> None:
    """Another model whose path happens to say minilm_l6_v2 (a fine-tuned copy) is named by its path,
    so a store written by the packaged one refuses it; the packaged one reached through a link is itself."""
    other = SentenceTransformerEmbedder(model=str(tmp_path / "my_minilm_l6_v2_finetuned"))
    assert not other.packaged and other.model_name == str(tmp_path / "my_minilm_l6_v2_finetuned")
    with pytest.raises(EmbedderMismatchError):
        check_vectors_match("all-MiniLM-L6-v2", other)
    (tmp_path / "link").symlink_to(packaged_model_path())
    linked = SentenceTransformerEmbedder(model=str(tmp_path / "link"))
    assert linked.packaged and linked.model_name == "all-MiniLM-L6-v2" and linked.dim == 384


def test_single_threaded_pins_onnx_runtime_sessions_built_after_it(cache_dir: str) -> None:
    """`serve` and `mcp` pin torch and BLAS to one thread; ONNX Runtime's sessions too, or each
    request thread's session runs a pool of one thread per core. In a child process: the pin is
    process-wide."""
    pytest.importorskip("onnxruntime")
    code = (
        "import torch\n"
        "from memory.embed import SentenceTransformerEmbedder, single_threaded\n"
        f"before = SentenceTransformerEmbedder(backend='onnx', cache_dir={cache_dir!r})\n"
        "before.embed(['warm up'])\n"
        "single_threaded()\n"
        f"after = SentenceTransformerEmbedder(backend='onnx', cache_dir={cache_dir!r})\n"
        "after.embed(['warm up'])\n"
        "threads = [e._load().session.get_session_options().intra_op_num_threads for e in (before, after)]\n"
        "print(*threads, torch.get_num_threads())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "1", "1"]
