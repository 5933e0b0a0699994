"""A Hugging Face `tokenizers` tokenizer.json, with BOS/EOS ids taken from the files."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from titanlite.core.io import special_kind

BUILTIN_TOKENIZER = (
    Path(__file__).resolve().parent.parent / "assets" / "tokenizer" / "tokenizer.json"
)

# Special-token names by convention, tried when no tokenizer_config.json says otherwise.
_KNOWN_PAIRS = [
    ("<|begin_of_text|>", "<|end_of_text|>"),
    ("<s>", "</s>"),
    ("<|endoftext|>", "<|endoftext|>"),
]


class TokenizerError(ValueError):
    pass


def resolve_tokenizer_path(path: str) -> Path:
    """'' = the built-in tokenizer; a folder = its tokenizer.json."""
    p = Path(path) if path else BUILTIN_TOKENIZER
    if p.is_dir():
        p = p / "tokenizer.json"
    if kind := special_kind(p):
        raise TokenizerError(
            f"model.tokenizer_path: {p} is {kind}, not a file; give a Hugging Face "
            "tokenizer.json (or a folder holding one)"
        )
    if not p.is_file():
        raise TokenizerError(
            f"model.tokenizer_path: {p} does not exist; give a Hugging Face tokenizer.json "
            "(or a folder holding one), or leave it empty for the built-in tokenizer"
        )
    return p


class Tokenizer:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self._tok = HFTokenizer.from_file(str(self.path))
        except Exception as e:  # tokenizers raises a bare Exception on a bad file
            raise TokenizerError(f"model.tokenizer_path: cannot read {self.path}: {e}") from None
        # A document that happens to contain "<|end_of_text|>" must not end itself: special
        # tokens come only from the framing below, never from the text.
        self._tok.encode_special_tokens = True
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        bos, eos = self._special_names()
        bos_id, eos_id = self._tok.token_to_id(bos), self._tok.token_to_id(eos)
        assert bos_id is not None and eos_id is not None  # _special_names checked both
        self.bos_id, self.eos_id = bos_id, eos_id

    def _special_names(self) -> tuple[str, str]:
        cfg_path = self.path.parent / "tokenizer_config.json"
        if cfg_path.is_file():
            try:
                cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise TokenizerError(f"{cfg_path}: cannot read it ({e})") from None

            def name(v: object) -> str | None:
                return v.get("content") if isinstance(v, dict) else v  # type: ignore[return-value]

            bos, eos = name(cfg.get("bos_token")), name(cfg.get("eos_token"))
            # A named token missing from the vocabulary is a mismatched pair of files; falling
            # back to a conventional pair would frame documents with tokens nobody asked for.
            for role, tok in (("bos_token", bos), ("eos_token", eos)):
                if tok and self._tok.token_to_id(tok) is None:
                    raise TokenizerError(
                        f"{cfg_path}: {role} {tok!r} is not in the vocabulary of {self.path}; "
                        "fix tokenizer_config.json or use the tokenizer.json it belongs with"
                    )
            if bos and eos:
                return bos, eos
        for bos, eos in _KNOWN_PAIRS:
            if self._tok.token_to_id(bos) is not None and self._tok.token_to_id(eos) is not None:
                return bos, eos
        raise TokenizerError(
            f"{self.path}: no BOS/EOS tokens found; add a tokenizer_config.json beside it with "
            "bos_token and eos_token"
        )

    @property
    def fingerprint(self) -> str:
        """Identifies the token ids this tokenizer produces: its file's bytes and BOS/EOS. Shards
        carry it, so that ids made by one tokenizer are never read with another's."""
        h = hashlib.sha256(self.path.read_bytes())
        h.update(f"{self.bos_id},{self.eos_id}".encode())
        return h.hexdigest()[:16]

    def encode_documents(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each document framed by BOS ... EOS (batched: Rust threads do the work)."""
        encodings = self._tok.encode_batch(texts, add_special_tokens=False)
        return [[self.bos_id, *e.ids, self.eos_id] for e in encodings]

    def encode(self, text: str) -> list[int]:
        """The text's ids, no BOS/EOS (as a Hugging Face tokenizer with add_special_tokens=False:
        lm-eval-harness's requests)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)
