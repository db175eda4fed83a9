"""Text sources and deterministic sampling of calibration windows.

Sources (``datasets`` entries of the config):

- ``embedded``: Wikipedia articles shipped in the ``gensim`` wheel's test data, wiki markup
  stripped, split by article into calibration and evaluation text (built by the resources rule
  into ``<dir>/calib.txt`` and ``<dir>/eval.txt``).
- ``hub``: an HF dataset (paper: ``wikitext`` / ``wikitext-2-raw-v1``, train for calibration,
  test for perplexity) through ``datasets.load_dataset``.
- ``files``: local text files ``calib`` and ``eval``.

Every split is one string: the documents joined by ``"\\n\\n"`` (the WikiText-2 protocol).
"""

from __future__ import annotations

import bz2
import hashlib
import io
import json
import re
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path
from typing import IO, Any

import torch

from coec.io.atomic import write_text

#: A dataset spec of the config (``datasets.<name>``)
Spec = dict[str, Any]

WIKI_MEMBER = "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"


# ----------------------------------------------------------------------------- wiki markup
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_REF = re.compile(r"<ref[^>/]*/>|<ref[^>]*>.*?</ref>", re.S | re.I)
_TAG = re.compile(r"<[^>]+>")
_TABLE = re.compile(r"\{\|.*?\|\}", re.S)
_FILE_LINK = re.compile(
    r"\[\[(?:File|Image|Category|[a-z]{2,3}(?:-[a-z]+)?):[^\[\]]*"
    r"(?:\[\[[^\[\]]*\]\][^\[\]]*)*\]\]",
    re.I,
)
_LINK = re.compile(r"\[\[(?:[^\[\]|]*\|)?([^\[\]]*)\]\]")
_EXT_LINK = re.compile(r"\[(?:https?|ftp)://[^\s\]]+\s*([^\]]*)\]")
_BOLD_ITALIC = re.compile(r"'{2,}")
_HEADING = re.compile(r"^=+\s*(.*?)\s*=+\s*$", re.M)
_LIST = re.compile(r"^[*#:;]+\s*", re.M)
_BLANKS = re.compile(r"\n{3,}")


def _strip_templates(text: str) -> str:
    """Remove (nested) ``{{...}}`` templates by a depth scan, linear in the text length."""
    out, depth, i, n = [], 0, 0, len(text)
    while i < n:
        two = text[i : i + 2]
        if two == "{{":
            depth += 1
            i += 2
        elif two == "}}" and depth:
            depth -= 1
            i += 2
        else:
            if not depth:
                out.append(text[i])
            i += 1
    return "".join(out)


def strip_wiki_markup(text: str) -> str:
    """Plain prose from MediaWiki markup: templates, tables, refs, files, tags dropped;
    links replaced by their label; headings kept as lines."""
    text = _COMMENT.sub("", text)
    text = _REF.sub("", text)
    text = _strip_templates(text)
    text = _TABLE.sub("", text)
    for _ in range(2):  # file links may nest other links
        text = _FILE_LINK.sub("", text)
    text = _LINK.sub(r"\1", text)
    text = _EXT_LINK.sub(r"\1", text)
    text = _TAG.sub("", text)
    text = _BOLD_ITALIC.sub("", text)
    text = _HEADING.sub(r"\1", text)
    text = _LIST.sub("", text)
    text = text.replace("&nbsp;", " ").replace("&ndash;", "–").replace("&mdash;", "—")
    lines = [ln.strip() for ln in text.splitlines()]
    return _BLANKS.sub("\n\n", "\n".join(lines)).strip()


def read_wiki_articles(bz2_path: str | Path | IO[bytes], min_words: int = 50) -> list[tuple[str, str]]:
    """(title, plain text) of the main-namespace, non-redirect articles of a MediaWiki dump,
    in file order; articles shorter than ``min_words`` after stripping are skipped."""
    articles = []
    with bz2.open(bz2_path, "rb") as fh:
        for _, elem in ET.iterparse(fh, events=("end",)):
            if not elem.tag.endswith("}page"):
                continue
            ns = elem.find("{*}ns")
            title = elem.find("{*}title")
            body = elem.find("{*}revision/{*}text")
            redirect = elem.find("{*}redirect")
            if ns is not None and ns.text == "0" and redirect is None and body is not None:
                text = strip_wiki_markup(body.text or "")
                if len(text.split()) >= min_words:
                    articles.append((title.text, text))
            elem.clear()
    return articles


def split_articles(articles: list[tuple[str, str]], eval_every: int) -> tuple[list[str], list[str]]:
    """Deterministic split by article: every ``eval_every``-th article (1-based) is evaluation."""
    if eval_every < 2:
        raise ValueError(f"eval_every must be >= 2, got {eval_every}")
    calib = [t for i, (_, t) in enumerate(articles) if (i + 1) % eval_every]
    evals = [t for i, (_, t) in enumerate(articles) if not (i + 1) % eval_every]
    return calib, evals


def build_embedded_wiki(wheel: str | Path, out_dir: str | Path, eval_every: int = 5) -> dict[str, Any]:
    """Extract the Wikipedia dump from the gensim wheel and write calib.txt / eval.txt and a
    manifest (article and word counts, sha256) into ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        try:
            raw = zf.read(WIKI_MEMBER)
        except KeyError:
            raise FileNotFoundError(f"{wheel} does not contain {WIKI_MEMBER}") from None
    articles = read_wiki_articles(io.BytesIO(raw))
    calib, evals = split_articles(articles, eval_every)
    manifest: dict[str, Any] = {
        "source": Path(wheel).name,
        "member": WIKI_MEMBER,
        "eval_every": eval_every,
        "sha256_source": hashlib.sha256(raw).hexdigest(),
    }
    for name, docs in (("calib", calib), ("eval", evals)):
        text = "\n\n".join(docs)
        write_text(out_dir / f"{name}.txt", text)
        manifest[name] = {
            "articles": len(docs),
            "words": len(text.split()),
            "sha256": hashlib.sha256(text.encode()).hexdigest(),
        }
    write_text(out_dir / "manifest.json", json.dumps(manifest, indent=2))
    return manifest


# ----------------------------------------------------------------------------- sources
def load_split(spec: Spec, split: str) -> str:
    """The text of ``split`` ('calib' or 'eval') of a dataset spec from the config."""
    if split not in ("calib", "eval"):
        raise ValueError(f"split must be 'calib' or 'eval', got {split!r}")
    kind = spec.get("source")
    if kind in ("embedded", "files"):
        path = Path(spec["dir"]) / f"{split}.txt" if kind == "embedded" else Path(spec[split])
        if not path.is_file():
            hint = " (built by the resources rule: snakemake --cores 1 " + str(path) + ")" if kind == "embedded" else ""
            raise FileNotFoundError(f"text file not found: {path}{hint}")
        return path.read_text()
    if kind == "hub":
        # deferred: datasets costs ~1.2 s to import; only hub datasets need it
        from datasets import load_dataset

        kwargs = {"data_files": spec["data_files"]} if spec.get("data_files") else {}
        ds = load_dataset(spec["path"], spec.get("name"), split=spec[f"{split}_split"], **kwargs)
        return "\n\n".join(ds[spec.get("text_field", "text")])
    raise ValueError(f"unknown dataset source {kind!r}; expected embedded, files or hub")


def tokenize_text(tokenizer: Any, text: str) -> torch.Tensor:
    """The whole text as one 1-D LongTensor of token ids (no special tokens added beyond what
    the tokenizer adds by default)."""
    ids: torch.Tensor = tokenizer(text, return_tensors="pt", add_special_tokens=True).input_ids[0]
    return ids.long()


def sample_windows(
    tokens: torch.Tensor, nsamples: int, seqlen: int, seed: int, exclude: dict[str, int] | None = None
) -> torch.Tensor:
    """``nsamples`` random windows of ``seqlen`` tokens from a token stream, (nsamples, seqlen).

    Start offsets are uniform in ``[0, len - seqlen]`` from a ``torch.Generator`` seeded with
    ``seed``: the same seed gives the same windows on every machine. ``exclude`` ({nsamples,
    seqlen, seed} of another set): only windows sharing no token with that set's
    (:func:`disjoint_starts`; a held-out calibration set).
    """
    if tokens.numel() <= seqlen:
        raise ValueError(f"calibration text has {tokens.numel()} tokens, fewer than seqlen={seqlen}")
    starts = (
        disjoint_starts(tokens.numel(), nsamples, seqlen, seed, exclude)
        if exclude
        else window_starts(tokens.numel(), nsamples, seqlen, seed)
    )
    return torch.stack([tokens[s : s + seqlen] for s in starts.tolist()])


def window_starts(n_tokens: int, nsamples: int, seqlen: int, seed: int) -> torch.Tensor:
    """The (nsamples,) start offsets ``sample_windows`` draws with ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, n_tokens - seqlen + 1, (nsamples,), generator=gen)


def disjoint_starts(n_tokens: int, nsamples: int, seqlen: int, seed: int, exclude: dict[str, int]) -> torch.Tensor:
    """Start offsets of windows that share no token with the windows of another calibration set
    (``exclude`` = its {nsamples, seqlen, seed}): candidates are drawn from ``seed``'s generator in
    order and kept while they overlap none of the excluded windows (deterministic)."""
    ex = window_starts(n_tokens, int(exclude["nsamples"]), int(exclude["seqlen"]), int(exclude["seed"]))
    ex_len = int(exclude["seqlen"])
    gen = torch.Generator().manual_seed(seed)
    kept: list[int] = []
    for _ in range(1000):
        cand = torch.randint(0, n_tokens - seqlen + 1, (4 * nsamples,), generator=gen)
        # [c, c + seqlen) and [e, e + ex_len) are disjoint iff c + seqlen <= e or e + ex_len <= c
        ok = ((cand[:, None] + seqlen <= ex[None, :]) | (ex[None, :] + ex_len <= cand[:, None])).all(1)
        kept += cand[ok].tolist()
        if len(kept) >= nsamples:
            return torch.tensor(kept[:nsamples])
    raise ValueError(
        f"cannot draw {nsamples} windows of {seqlen} tokens disjoint from the excluded set: "
        f"the text ({n_tokens} tokens) is too short"
    )


def eval_windows(tokens: torch.Tensor, seqlen: int, max_windows: int | None = None) -> torch.Tensor:
    """Non-overlapping windows of ``seqlen`` tokens (the trailing partial window is dropped),
    optionally capped to the first ``max_windows``: (n_windows, seqlen)."""
    n = tokens.numel() // seqlen
    if max_windows:
        n = min(n, max_windows)
    if n == 0:
        raise ValueError(f"evaluation text has {tokens.numel()} tokens, fewer than seqlen={seqlen}")
    return tokens[: n * seqlen].view(n, seqlen)


def calibration_ids(tokenizer: Any, dataset: Spec, nsamples: int, seqlen: int, seed: int) -> torch.Tensor:
    """The (nsamples, seqlen) calibration windows of a dataset spec (``exclude_windows``: a
    held-out set's, disjoint from another set's windows)."""
    tokens = tokenize_text(tokenizer, load_split(dataset, "calib"))
    return sample_windows(tokens, nsamples, seqlen, seed, dataset.get("exclude_windows"))
