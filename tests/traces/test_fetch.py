"""``twin traces fetch``: checksum logic and the failure path, with local file:// URLs."""

from __future__ import annotations

import hashlib
import tarfile

import pytest

from traces.fetch import SOURCES, EmptyDownloadError, FetchError, Source, download, fetch


def _file(tmp_path, content=b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,1,2\n"):
    p = tmp_path / "upstream.csv"
    p.write_bytes(content)
    return p, hashlib.sha256(content).hexdigest()


def test_download_verifies_checksum(tmp_path):
    src, digest = _file(tmp_path)
    dest = tmp_path / "data" / "x.csv"
    assert download(src.as_uri(), dest, digest) == digest
    assert dest.read_bytes() == src.read_bytes()


def test_checksum_mismatch_leaves_no_file(tmp_path):
    src, _ = _file(tmp_path)
    dest = tmp_path / "data" / "x.csv"
    with pytest.raises(FetchError, match="checksum mismatch"):
        download(src.as_uri(), dest, "0" * 64)
    assert not dest.exists() and not (dest.parent / "x.csv.part").exists()


def test_empty_download_is_refused_and_leaves_no_file(tmp_path):
    src, _ = _file(tmp_path, b"")
    dest = tmp_path / "data" / "x.csv"
    with pytest.raises(EmptyDownloadError, match=f"the download from {src.as_uri()} is empty"):
        download(src.as_uri(), dest)
    assert not dest.exists() and not (dest.parent / "x.csv.part").exists()
    sources = {"demo": Source("demo", "traces/demo.csv", src.as_uri())}  # no pinned digest
    with pytest.raises(EmptyDownloadError, match="nothing was saved"):  # not taken for a network failure
        fetch("demo", tmp_path / "data", sources=sources)
    assert not (tmp_path / "data" / "traces" / "demo.csv").exists()


def test_fetch_by_name_with_url_override(tmp_path):
    src, digest = _file(tmp_path)
    sources = {"demo": Source("demo", "traces/demo.csv", src.as_uri(), digest)}
    root = tmp_path / "data"
    p = fetch("demo", root, sources=sources)
    assert p == root / "traces/demo.csv" and p.exists()
    # already there: kept; a corrupted copy is reported
    assert fetch("demo", root, sources=sources) == p
    p.write_bytes(b"corrupt")
    with pytest.raises(FetchError, match="--force"):
        fetch("demo", root, sources=sources)
    assert fetch("demo", root, sources=sources, force=True).read_bytes() == src.read_bytes()


def test_unreachable_url_says_what_to_do(tmp_path):
    missing = (tmp_path / "nowhere.csv").as_uri()
    with pytest.raises(FetchError) as e:
        fetch("splitwise", tmp_path / "data", url=missing, timeout=2)
    msg = str(e.value)
    assert "no network" in msg and "traces/AzureLLMInferenceTrace_conv.csv" in msg and "TWIN_DATA_DIR" in msg
    assert SOURCES["splitwise"].sha256 in msg
    assert not (tmp_path / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv").exists()
    # the digest's provenance is said as such (it ended the instructions as a stray phrase), and the folders the
    # failed download made are removed (it left an empty traces/ in the data directory)
    assert f"(sha256 {SOURCES['splitwise'].sha256}, of the copy in the shared data directory)" in msg
    assert msg.endswith("holds traces/AzureLLMInferenceTrace_conv.csv.")
    assert not (tmp_path / "data").exists()
    (tmp_path / "kept" / "traces").mkdir(parents=True)  # folders that were there stay
    with pytest.raises(FetchError):
        fetch("splitwise", tmp_path / "kept", url=missing, timeout=2)
    assert (tmp_path / "kept" / "traces").is_dir()


def test_a_missing_trace_names_the_fetch_command_without_the_digest_note(tmp_path):
    from traces.registry import get_workload

    with pytest.raises(FileNotFoundError) as e:
        get_workload("splitwise", data_dir=tmp_path)
    assert str(e.value).endswith("run `twin traces fetch splitwise`, or set TWIN_DATA_DIR to a directory that holds it")


def test_gated_dataset_manual_instructions(tmp_path):
    with pytest.raises(FetchError, match="huggingface.co/datasets/lmsys/lmsys-chat-1m"):
        fetch("lmsys", tmp_path)


def test_unknown_name(tmp_path):
    with pytest.raises(KeyError, match="splitwise"):
        fetch("nope", tmp_path)


def test_tar_xz_archive_is_extracted(tmp_path):
    inner = tmp_path / "invocations_per_function_md.anon.d01.csv"
    inner.write_text("HashOwner,HashApp,HashFunction,Trigger\n")
    arch = tmp_path / "pack.tar.xz"
    with tarfile.open(arch, "w:xz") as tf:
        tf.add(inner, arcname=inner.name)
    digest = hashlib.sha256(arch.read_bytes()).hexdigest()
    sources = {"fx": Source("fx", "traces/fx", arch.as_uri(), digest, archive="tar.xz")}
    out = fetch("fx", tmp_path / "data", sources=sources)
    assert (out / inner.name).exists()


def test_pinned_digests_match_the_shared_copies(real_data):
    for name in ("splitwise", "splitwise-code"):
        p = real_data / SOURCES[name].dest
        assert hashlib.sha256(p.read_bytes()).hexdigest() == SOURCES[name].sha256


def test_extraction_without_the_data_filter_refuses_escaping_members(tmp_path, monkeypatch):
    """Pythons before 3.11.4 have no ``filter="data"``: the same checks are made by hand."""
    import io
    import tarfile

    from traces.fetch import FetchError, extract_safely

    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    good, bad = tmp_path / "good.tar", tmp_path / "bad.tar"
    for path, name in ((good, "dir/a.txt"), (bad, "../evil.txt")):
        with tarfile.open(path, "w") as tf:
            info = tarfile.TarInfo(name)
            info.size = 2
            tf.addfile(info, io.BytesIO(b"ok"))
    with tarfile.open(good) as tf:
        extract_safely(tf, tmp_path / "out")
    assert (tmp_path / "out" / "dir" / "a.txt").read_text() == "ok"
    with tarfile.open(bad) as tf, pytest.raises(FetchError, match="refusing to extract"):
        extract_safely(tf, tmp_path / "out2")
    assert not (tmp_path / "evil.txt").exists()


def test_a_missing_data_file_names_the_option_that_gave_the_directory(tmp_path, monkeypatch):
    """A --data-dir that lacks the file is named as the one to fix (it said to set TWIN_DATA_DIR, which was not used)."""
    from traces.datadir import require

    with pytest.raises(FileNotFoundError, match=r"\(from --data-dir\); give --data-dir a directory that holds it"):
        require("validation/x.csv", tmp_path)
    monkeypatch.setenv("TWIN_DATA_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"\(from TWIN_DATA_DIR\); give TWIN_DATA_DIR a directory"):
        require("validation/x.csv")
