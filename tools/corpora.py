"""Where the benchmarks and tools find the real corpora.

What the repository ships is in fixtures/ (fixtures/README.md): ten real
tokenizer files, the chat corpus, a 3 MB excerpt of the Debian documentation
corpus. What it does not ship (the whole 92 MB corpus the headline figures
are measured on, Gemma 3's tokenizer, the Llama and Gemma chat templates) is
read from the directory PREP_EXTERNAL_DATA names, laid out as fixtures/README.md
says; without the variable, ../shared/corpora beside the checkout. A file
missing from both ends the run saying which and where it was looked for.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"


def corpora() -> Path:
    """The directory of what the repository does not ship."""
    named = os.environ.get("PREP_EXTERNAL_DATA")
    return Path(named) if named else REPO.parent / "shared" / "corpora"


def external(rel: str) -> Path:
    """A file of corpora(), or exit saying where it was looked for."""
    path = corpora() / rel
    if not path.exists():
        sys.exit(f"{path} is not there: this benchmark reads {rel} from the directory PREP_EXTERNAL_DATA "
                 f"names (fixtures/README.md), else ../shared/corpora beside the checkout")
    return path


def tokenizer(name: str) -> Path:
    """A real tokenizer file: fixtures/tokenizers, else corpora()/tokenizers."""
    here = FIXTURES / "tokenizers" / f"{name}.tokenizer.json.zst"
    return here if here.exists() else external(f"tokenizers/{here.name}")


def find_chat(rel: str) -> Path | None:
    """A file of the chat corpus: fixtures/chat/corpus (datasets as FILE.zst),
    else corpora()/chat; None where neither has it."""
    here = FIXTURES / "chat" / "corpus" / rel
    for path in (here, here.with_name(here.name + ".zst"), corpora() / "chat" / rel):
        if path.exists():
            return path
    return None


def chat(rel: str) -> Path:
    """find_chat(rel), or exit saying where it was looked for."""
    return find_chat(rel) or external(f"chat/{rel}")


def read_text(path: Path) -> str:
    """A file's text, zstd-decompressed where its name ends in .zst."""
    data = path.read_bytes()
    if path.suffix == ".zst":
        import zstandard

        data = zstandard.ZstdDecompressor().decompressobj().decompress(data)
    return data.decode("utf-8")
