"""``twin traces fetch NAME``: download a public trace into the data directory, checksummed.

Each :class:`Source` names a URL, where the file goes inside the data directory
(``traces.datadir.data_dir()``), and its sha256 where one is pinned. The download streams to a
``.part`` file with a timeout, is hashed on the way, and only replaces the destination when
the checksum matches (a mismatch deletes the partial file and names both digests). Sources
without a pinned digest are downloaded and their digest is reported so it can be pinned.

Some datasets are gated (LMSYS-Chat-1M, Chatbot Arena) or split into many shards (WildChat):
for those ``fetch`` prints what to download by hand and where to put it. On a machine without
network access every fetch fails with a message that says the same.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from traces.datadir import sha256_file

from traces.datadir import data_dir

DEFAULT_TIMEOUT_S = 60.0


class FetchError(RuntimeError):
    """A download that failed or did not match its checksum."""


class EmptyDownloadError(FetchError):
    """A download that delivered no bytes (nothing is saved)."""


@dataclass(frozen=True)
class Source:
    """Where a public trace comes from and where it goes in the data directory."""

    name: str
    dest: str                     # path inside the data directory (file, or directory for archives)
    url: str | None               # None: manual download only (gated / sharded)
    sha256: str | None = None     # pinned digest of the downloaded file
    archive: str | None = None    # "tar.xz": extracted into ``dest``; "rar": kept, extraction by hand
    page: str = ""                # human page of the dataset
    note: str = ""                # why it cannot be downloaded automatically, or how to get it
    digest_of: str = ""           # what the pinned sha256 is the digest of


AZURE = "https://raw.githubusercontent.com/Azure/AzurePublicDataset/master/data"
SOURCES: dict[str, Source] = {s.name: s for s in [
    Source("splitwise", "traces/AzureLLMInferenceTrace_conv.csv", f"{AZURE}/AzureLLMInferenceTrace_conv.csv",
           "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
           page="https://github.com/Azure/AzurePublicDataset (AzureLLMInferenceDataset2023.md)",
           digest_of="the copy in the shared data directory"),
    Source("splitwise-code", "traces/AzureLLMInferenceTrace_code.csv", f"{AZURE}/AzureLLMInferenceTrace_code.csv",
           "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
           page="https://github.com/Azure/AzurePublicDataset (AzureLLMInferenceDataset2023.md)",
           digest_of="the copy in the shared data directory"),
    Source("splitwise-2024", "traces/AzureLLMInferenceTrace_conv_1week.csv",
           "https://azurepublicdatasettraces.blob.core.windows.net/azurellminfererencetrace/"
           "AzureLLMInferenceTrace_conv_1week.csv",
           page="https://github.com/Azure/AzurePublicDataset (AzureLLMInferenceDataset2024.md)"),
    Source("splitwise-code-2024", "traces/AzureLLMInferenceTrace_code_1week.csv",
           "https://azurepublicdatasettraces.blob.core.windows.net/azurellminfererencetrace/"
           "AzureLLMInferenceTrace_code_1week.csv",
           page="https://github.com/Azure/AzurePublicDataset (AzureLLMInferenceDataset2024.md)"),
    Source("azure-functions", "traces/azurefunctions-dataset2019",
           "https://azurecloudpublicdataset2.blob.core.windows.net/azurepublicdatasetv2/"
           "azurefunctions_dataset2019/azurefunctions-dataset2019.tar.xz", archive="tar.xz",
           page="https://github.com/Azure/AzurePublicDataset (AzureFunctionsDataset2019.md)"),
    Source("azure-functions-2021", "traces/AzureFunctionsInvocationTraceForTwoWeeksJan2021.txt",
           f"{AZURE}/AzureFunctionsInvocationTraceForTwoWeeksJan2021.rar", archive="rar",
           page="https://github.com/Azure/AzurePublicDataset (AzureFunctionsInvocationTrace2021.md)"),
    Source("sharegpt", "traces/ShareGPT_V3_unfiltered_cleaned_split.json",
           "https://huggingface.co/datasets/anon8231489123/ShareGPT_Vicuna_unfiltered/resolve/main/"
           "ShareGPT_V3_unfiltered_cleaned_split.json",
           page="https://huggingface.co/datasets/anon8231489123/ShareGPT_Vicuna_unfiltered"),
    Source("burstgpt", "traces/BurstGPT_1.csv",
           "https://github.com/HPMLL/BurstGPT/releases/download/v1.1/BurstGPT_1.csv",
           page="https://github.com/HPMLL/BurstGPT"),
    Source("lmsys", "traces/lmsys-chat-1m", None, page="https://huggingface.co/datasets/lmsys/lmsys-chat-1m",
           note="gated: accept the licence on the dataset page, then download data/*.parquet into this directory"),
    Source("chatbot-arena", "traces/chatbot_arena_conversations", None,
           page="https://huggingface.co/datasets/lmsys/chatbot_arena_conversations",
           note="gated: accept the licence on the dataset page, then download data/*.parquet into this directory"),
    Source("wildchat", "traces/wildchat", None, page="https://huggingface.co/datasets/allenai/WildChat-1M",
           note="sharded: download some or all data/*.parquet shards into this directory"),
]}


def extract_safely(tf: tarfile.TarFile, dest: Path) -> None:
    """Extract regular files and directories only, all inside ``dest``: the ``data`` filter where
    this Python has it (3.11.4+, 3.10.12+), the same checks by hand before."""
    if hasattr(tarfile, "data_filter"):
        tf.extractall(dest, filter="data")
        return
    root = Path(dest).resolve()
    for m in tf.getmembers():
        target = (root / m.name).resolve()
        if not (m.isfile() or m.isdir()) or (target != root and root not in target.parents):
            raise FetchError(f"refusing to extract {m.name!r}: only files and folders inside {dest} are extracted")
    tf.extractall(dest)


def fetch_command(name: str) -> str:
    return f"twin traces fetch {name}"


def _manual(src: Source, dest: Path, why: str) -> str:
    where = f"put it at {dest}" if not src.archive else f"extract it into {dest}"
    digest = f" (sha256 {src.sha256}{', of ' + src.digest_of if src.digest_of else ''})" if src.sha256 else ""
    return (f"{why}. Download {src.url or src.page} on a machine with network access{digest} and {where}, "
            f"or point TWIN_DATA_DIR (or --data-dir) at a directory that already holds "
            f"{src.dest}.{' ' + src.note if src.note else ''}")


def download(url: str, dest: Path, sha256: str | None = None, timeout: float = DEFAULT_TIMEOUT_S) -> str:
    """Stream ``url`` to ``dest`` (via ``dest.part``), verify ``sha256``; return the digest.

    Raises :class:`FetchError` on a network error, a timeout, a checksum mismatch or an empty
    download (:class:`EmptyDownloadError`); the partial file is removed and ``dest`` is left untouched.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    h = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, open(part, "wb") as out:  # noqa: S310
            for chunk in iter(lambda: resp.read(1 << 20), b""):
                h.update(chunk)
                out.write(chunk)
    except (urllib.error.URLError, OSError, ValueError) as e:
        part.unlink(missing_ok=True)
        reason = getattr(e, "reason", e)
        raise FetchError(f"could not download {url}: {reason}") from e
    if part.stat().st_size == 0:
        part.unlink(missing_ok=True)
        raise EmptyDownloadError(f"the download from {url} is empty (0 bytes); nothing was saved to {dest}; check "
                                 f"that the URL names the trace file itself, or give another with --url")
    digest = h.hexdigest()
    if sha256 and digest != sha256.lower():
        part.unlink(missing_ok=True)
        raise FetchError(f"checksum mismatch for {url}: expected sha256 {sha256}, got {digest}; "
                         f"the file was not saved (the upstream file may have changed: check it and update the "
                         f"pinned digest in traces/fetch.py)")
    os.replace(part, dest)
    return digest


def fetch(name: str, root: str | os.PathLike | None = None, *, force: bool = False, url: str | None = None,
          sha256: str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
          sources: dict[str, Source] | None = None) -> Path:
    """Download trace ``name`` into the data directory; return its path there.

    ``url``/``sha256`` override the table (e.g. a mirror, or a ``file://`` URL). An existing
    destination is kept (its digest checked when pinned) unless ``force``.
    """
    sources = SOURCES if sources is None else sources
    if name not in sources:
        raise KeyError(f"no download source for {name!r}; fetchable: {', '.join(sorted(sources))}")
    src = sources[name]
    base = data_dir(root)
    dest = base / src.dest
    link = url or src.url
    digest_expected = sha256 or src.sha256
    if dest.exists() and not force:
        if digest_expected and dest.is_file() and sha256_file(dest) != digest_expected:
            raise FetchError(f"{dest} exists but its sha256 differs from the pinned {digest_expected}; "
                             f"re-run with --force to replace it")
        return dest
    if link is None:
        raise FetchError(_manual(src, dest, f"{name} cannot be downloaded automatically ({src.note})"))
    made = [p for p in (dest.parent, *dest.parent.parents) if not p.exists()]  # (removed again if the fetch fails)
    try:
        if src.archive in ("tar.xz", "rar"):
            arch = dest.parent / Path(link).name
            download(link, arch, digest_expected, timeout)
            if src.archive == "rar":
                raise FetchError(f"downloaded {arch}; it is a RAR archive, which Python cannot extract: run "
                                 f"`unrar x {arch} {dest.parent}/` (or `bsdtar -xf`) so that {dest} exists")
            tmp = dest.with_name(dest.name + ".extract")
            shutil.rmtree(tmp, ignore_errors=True)
            with tarfile.open(arch, "r:xz") as tf:
                extract_safely(tf, tmp)
            if dest.exists():
                shutil.rmtree(dest)
            os.replace(tmp, dest)
            arch.unlink(missing_ok=True)
        else:
            download(link, dest, digest_expected, timeout)
    except FetchError as e:
        for p in made:  # the folders the download created, when it left nothing in them
            try:
                p.rmdir()
            except OSError:
                break
        if isinstance(e, EmptyDownloadError) or "RAR archive" in str(e) or "checksum mismatch" in str(e):
            raise
        raise FetchError(_manual(src, dest, f"fetching {name} failed ({e}); this machine may have no network "
                                            f"access")) from e
    return dest
