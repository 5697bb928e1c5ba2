"""Every bad input a clear error before any work: exit code 2, the option, file or row named and
the fix; never a traceback, never a silent acceptance (issue 16, item 3).

``CASES`` is the table of bad inputs tried (the issue note lists them with their messages): each
row is a command line (``{d}`` is a directory of prepared files, see :func:`files`) and a
fragment the error must contain. A property-based test then drives random argument lists and
random files through ``twin.cli.main``.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import shlex
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from twin.cli import main
from twin.config import ConfigError
from twin.scenario import RunConfig, check_run

GARBAGE = bytes(range(256)) * 2


def _parquet(columns: dict[str, list]) -> bytes:
    """A Parquet file (no workload metadata) with these columns."""
    import pandas as pd

    buf = io.BytesIO()
    pd.DataFrame(columns).to_parquet(buf, index=False)
    return buf.getvalue()


#: prepared files: name -> content
FILES: dict[str, bytes] = {
    "empty.csv": b"",
    "header.csv": b"arrival_s,prompt_tokens,output_tokens\n",
    "header.jsonl": b"\n\n",
    "garbage.bin": GARBAGE,
    "garbage.csv": GARBAGE,
    "garbage.parquet": GARBAGE,
    "garbage.json": GARBAGE,
    "garbage.toml": GARBAGE,
    "text.toml": b"this is = = not toml\n",
    "empty.toml": b"",
    "list.json": b"[1, 2, 3]\n",
    "badtype.toml": b'rps = "fast"\n',
    "unknownkey.toml": b"rpz = 3\n",
    "twice.toml": b"max-num-seqs = 4\nmax_num_seqs = 8\nduration = 5\n",
    "zero.toml": b"rps = 0\n",
    # options of the other serving system in a hand-written scenario (the flags are refused; the file's were ignored)
    # YAML 1.1 numbers PyYAML would read silently as others (base 60)
    "sexagesimal.yaml": b"duration: 5\nmax_num_seqs: 1:00\n",
    "base_only.csv": b"arrival_s,prompt_tokens,output_tokens\n0.5,100,10\n0.1,50,5\n",
    "opts_fcfs.toml": b'duration = 5\npolicy = "chameleon"\n[scheduler_options]\nrefresh_s = 2\n',
    "conv_no_turn.csv": b"arrival_s,prompt_tokens,output_tokens,conversation_id\n0.1,10,5,1\n0.2,10,5,1\n",
    "both_tables.toml": b'duration = 5\npolicy = "chameleon"\n[scheduler_options]\nslo_s = "abc"\n[cache_options]\n'
                        b'freq_window_s = 60\n',
    "cache_table.toml": b'duration = 5\npolicy = "chameleon"\n[cache_options]\nfreq_window_s = "x"\n',
    "bad_digest.toml": b'duration = 5\ntrace_sha256 = "xyz"\n',
    "burst.csv": b"arrival_s,prompt_tokens,output_tokens\n" + b"0,100,10\n" * 20,
    "slora_slots.toml": b'policy = "chameleon"\nslots = 8\nduration = 5\n',
    "vllm_slora_opt.toml": b'policy = "vllm"\nslora_max_prompt_len = 5\nduration = 5\n',
    "ranks.toml": b'ranks = "8-128"\n',
    "scenario.ini": b"[run]\nrps = 2\n",
    "missing.csv": b"arrival_s,prompt_tokens\n0.5,10\n",
    "extra.csv": b"arrival_s,prompt_tokens,output_tokens,adaptor_id\n0.5,10,5,1\n",
    "nonnum.csv": b"arrival_s,prompt_tokens,output_tokens\n0.5,100,10\n1.0,abc,10\n",
    "neg.csv": b"arrival_s,prompt_tokens,output_tokens\n0.5,100,10\n1.0,-3,10\n",
    "nan.csv": b"arrival_s,prompt_tokens,output_tokens\n0.5,100,10\nnan,3,10\n",
    "frac.csv": b"arrival_s,prompt_tokens,output_tokens\n0.5,100.5,10\n",
    "negarrival.csv": b"arrival_s,prompt_tokens,output_tokens\n-1,100,10\n",
    "norank.csv": b"arrival_s,prompt_tokens,output_tokens,adapter_id\n0.5,100,10,3\n",
    "rank0.csv": b"arrival_s,prompt_tokens,output_tokens,adapter_id,adapter_rank\n0.5,100,10,3,0\n",
    "tworanks.csv": b"arrival_s,prompt_tokens,output_tokens,adapter_id,adapter_rank\n0.5,10,5,1,8\n0.7,10,5,1,16\n",
    "dupid.csv": b"request_id,arrival_s,prompt_tokens,output_tokens\n1,0.5,10,5\n1,0.7,10,5\n",
    "emptycell.csv": b"arrival_s,prompt_tokens,output_tokens\n0.5,,10\n",
    "bad.jsonl": b'{"arrival_s": 0.1, "prompt_tokens": 10, "output_tokens": 5}\n{"arrival_s": 0.2, "prompt_tokens": "x", '
                 b'"output_tokens": 5}\n',
    "notobj.jsonl": b'{"arrival_s": 0.1, "prompt_tokens": 10, "output_tokens": 5}\n[1, 2]\n',
    "broken.jsonl": b'{"arrival_s": 0.1, "prompt_tokens": 10, "output_tokens": 5}\n{"arrival_s": \n',
    "bool.jsonl": b'{"arrival_s": 0.1, "prompt_tokens": true, "output_tokens": 5}\n',
    "azure_header.csv": b"TIMESTAMP,ContextTokens,GeneratedTokens\n",
    "notrace.csv": b"a,b,c\n1,2,3\n",
    "notprofile.json": b'{"schema": "something-else"}\n',
    "brokenprofile.json": b'{"schema": "lora-twin-profile/1", "name": "x", "model": "llama-3.1-8b"}\n',
    "afile": b"x",
    # sweep grids that used to hang, exhaust memory or run nothing
    "explode.toml": b"[scenarios]\nrate_values = [" + ", ".join(str(0.1 * (i + 1)) for i in range(20)).encode()
                    + b"]\nrate_arity = 10\nranks = [[8]]\n[configs]\nserved = [8]\nslots = [8]\n",
    "bigserved.toml": b"window_s = 20\n[scenarios]\nrates = [[0.4, 0.2]]\nranks = [[8]]\n[configs]\n"
                      b"served = [100000000]\nslots = [8]\n",
    "lowrank.toml": b"window_s = 20\n[scenarios]\nrates = [[0.4, 0.2]]\nranks = [[8, 16]]\n[configs]\nserved = [4]\n"
                    b"slots = [2]\nmax_lora_rank = [8]\n",
    # a grid whose every run would be empty; one whose engine override contradicts its slots axis; a valid one
    "tinywindow.toml": b"window_s = 1e-9\n[scenarios]\nrates = [[0.4, 0.2]]\nranks = [[8]]\n[configs]\nserved = [8]\n"
                       b"slots = [8]\n",
    "engineaxis.toml": b"window_s = 20\n[scenarios]\nrates = [[0.4, 0.2]]\nranks = [[8]]\n[configs]\nserved = [8]\n"
                       b"slots = [8]\nengine = { max_loras = 3 }\n",
    "okgrid.toml": b"window_s = 20\n[scenarios]\nrates = [[0.4, 0.2]]\nranks = [[8]]\n[configs]\nserved = [8]\n"
                   b"slots = [8]\n",
    "hugeslots.toml": b"slots = 1e308\n",
    "nanrank.csv": b"arrival_s,prompt_tokens,output_tokens,adapter_id,adapter_rank\n0.5,10,5,1,8\n0.7,10,5,2,\n",
    # a raw trace with its own timestamps; sweep grids with a rank vLLM cannot serve, an S-LoRA engine field
    "azure.csv": b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
                 b"2023-11-16 18:15:50.9951690,396,109\n",
    "bigrank.toml": b"window_s = 20\n[scenarios]\nrates = [[0.4, 0.2]]\nranks = [[8, 1024]]\n[configs]\nserved = [8]\n"
                    b"slots = [8]\n",
    "bigmaxrank.toml": b"window_s = 20\n[scenarios]\nrates = [[0.4, 0.2]]\nranks = [[8]]\n[configs]\nserved = [8]\n"
                       b"slots = [8]\nmax_lora_rank = [8, 1024]\n",
    "sloraengine.toml": b"window_s = 20\n[scenarios]\nrates = [[0.4, 0.2]]\nranks = [[8]]\n[configs]\nserved = [8]\n"
                        b"slots = [8]\nengine = { slora_max_wait_tokens = 3 }\n",
    "noarrival.parquet": _parquet({"prompt_tokens": [10], "output_tokens": [5]}),
    # Parquet list columns: cells are arrays ([1, 2] raised numpy's "can only convert an array of size 1")
    "listcol.parquet": _parquet({"arrival_s": [0.0, 1.0], "prompt_tokens": [[5], [1, 2]], "output_tokens": [5, 5]}),
    # arrivals as epoch timestamps, and arrivals that start after a horizon
    "epoch.csv": b"arrival_s,prompt_tokens,output_tokens\n1700000000,100,10\n1700000000.5,100,10\n",
    "late.csv": b"arrival_s,prompt_tokens,output_tokens\n100,100,10\n100.5,100,10\n",
    # a garbled arrival far past any clock (its integer was printed in full: a 300-digit line)
    "huge.csv": b"arrival_s,prompt_tokens,output_tokens\n0.5,100,10\n1e300,100,10\n",
    # a trailing comma on every row (pandas took the first column as row labels and shifted every value left), a
    # column named twice (the second read as "arrival_s.1"), a rank on a base-model request (dropped), workload
    # columns in a .json file and a workload in a directory ("unrecognised trace format"), repeated scenario keys
    # (the last one won)
    "trailing.csv": b"arrival_s,prompt_tokens,output_tokens\n0.5,100,10,\n1.0,100,10,\n",
    "dupcol.csv": b"arrival_s,prompt_tokens,output_tokens,arrival_s\n0.5,100,10,3\n",
    "baserank.csv": b"arrival_s,prompt_tokens,output_tokens,adapter_id,adapter_rank\n0.5,100,10,1,8\n0.6,100,10,,8\n",
    "workload.json": b'[{"arrival_s": 0.1, "prompt_tokens": 10, "output_tokens": 5}]\n',
    "wdir/a.csv": b"arrival_s,prompt_tokens,output_tokens\n0.5,100,10\n",
    "dupkey.yaml": b"rps: 2\nduration: 5\nrps: 3\n",
    "dupkey.json": b'{"rps": 2, "rps": 3}\n',
    # a run summary without its scenario table (an older twin's): listed some 50 metrics as unknown options
    "oldsummary.json": b'{"policy": "vllm", "requests_arrived": 10, "throughput_rps": 1.0, "ttft_ms_mean": 5.0}\n',
    "strsummary.json": b'{"policy": "vllm", "requests_arrived": 10, "scenario": "vllm"}\n',
    "listopt.toml": b"duration = 5\ntrace_options = {length_scale = [1]}\n",
}
_REAL_HEADER = (b"model,source,scenario,run_dir,ranks,rates,served_adapters,adapter_slots,max_lora_rank,status,"
                b"offered_req_s,pool_mean_input_tokens,pool_mean_output_tokens\n")


def _real_with(column: str, value: str, status: str = "ok") -> bytes:
    """A one-run real table with one more ``column`` holding ``value``."""
    return (_REAL_HEADER.replace(b"\n", f",{column}\n".encode())
            + f"llama-3.1-8b,ml_test,s,r,8-16-32,0.4-0.1-0.05,16,16,32,{status},1,222,197,{value}\n".encode())


FILES.update({  # ShareGPT-format conversation files: a valid one, and some with a malformed turn
    "conv.json": b'[{"id": "a", "conversations": [{"from": "human", "value": "hello there"}, {"from": "gpt", "value": '
                 b'"fine thanks"}, {"from": "human", "value": "good"}, {"from": "gpt", "value": "great"}]}]',
    "conv_int.json": b'[{"id": "a", "conversations": 5}]',
    "conv_value.json": b'[{"id": "a", "conversations": [{"from": "human", "value": 5}, {"from": "gpt", "value": "x"}]}]',
    "conv_lacks.json": b'[{"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": '
                       b'"x"}]}, {"id": "b"}]',
})


FILES.update({  # real-run tables (twin validate, twin configure evaluate) with one bad row
    "real_rates.csv": _REAL_HEADER + b"llama-3.1-8b,ml_test,s,r,8-16-32,abc,16,16,32,ok,1,222,197\n",
    "real_served.csv": _REAL_HEADER + b"llama-3.1-8b,ml_test,s,r,8-16-32,0.4-0.1-0.05,-5,16,32,ok,1,222,197\n",
    "real_slots.csv": _REAL_HEADER + b"llama-3.1-8b,ml_test,s,r,8-16-32,0.4-0.1-0.05,16,,32,ok,1,222,197\n",
    "real_lengths.csv": _REAL_HEADER + b"llama-3.1-8b,ml_test,s,r,8-16-32,0.4-0.1-0.05,16,16,32,ok,1,long,197\n",
    "real_status.csv": _REAL_HEADER + b"llama-3.1-8b,ml_test,s,r,8-16-32,0.4-0.1-0.05,16,16,32,weird,1,222,197\n",
    "real_maxrank.csv": _REAL_HEADER + b"llama-3.1-8b,ml_test,s,r,8-16-32,0.4-0.1-0.05,16,16,16,ok,1,222,197\n",
    "real_classes.csv": _REAL_HEADER + b"llama-3.1-8b,ml_test,s,r,8-16-32,0.4-0.1-0.05,2,2,32,ok,1,222,197\n",
    "real_nosource.csv": _REAL_HEADER + b"llama-3.1-8b,,s,r,8-16-32,0.4-0.1-0.05,16,16,32,ok,1,222,197\n",
    "real_itl.csv": _real_with("mean_itl_ms", "-5"),
    "real_sent.csv": _real_with("requests_sent", "-3"),
    "real_seqs.csv": _real_with("max_num_seqs", "0"),
    "real_cpu.csv": _real_with("max_cpu_loras", "1"),
    "real_huge.csv": _REAL_HEADER + b"llama-3.1-8b,ml_test,s,r,8-16-32,4000-0.1-0.05,16,16,32,ok,1,222,197\n",
    # numbers as text (a bare "could not convert string to float" before), a window or max_num_seqs the twin
    # cannot re-create, pool lengths the length model cannot draw (each failed alone, after the other runs)
    "real_bttext.csv": _real_with("benchmark_time_s", "long"),
    "real_senttext.csv": _real_with("requests_sent", "many"),
    "real_senthalf.csv": _real_with("requests_sent", "1200.5"),
    # a row that contradicts itself: more requests finished than the client sent
    "real_sentfew.csv": (_REAL_HEADER.replace(b"\n", b",requests_sent,successful_requests\n")
                         + b"llama-3.1-8b,ml_test,s,r,8-16-32,0.4-0.1-0.05,16,16,32,ok,1,222,197,100,150\n"),
    "real_itltext.csv": _real_with("mean_itl_ms", "fast"),
    "real_btzero.csv": _real_with("benchmark_time_s", "0", "failed_kv_insufficient"),
    "real_bthuge.csv": _real_with("benchmark_time_s", "1e12"),
    "real_seqshuge.csv": _real_with("max_num_seqs", "1000000"),
    "real_longpool.csv": _REAL_HEADER + b"llama-3.1-8b,ml_test,s,r,8-16-32,0.4-0.1-0.05,16,16,32,ok,1,222,1e12\n",
    # a valid row, but no measured throughput to find the real optimum from (configure evaluate)
    "real_unmeasured.csv": _REAL_HEADER + b"llama-3.1-8b,ml_test,s,r,8-16-32,0.4-0.1-0.05,16,16,32,ok,1,222,197\n",
    "real_textmeasured.csv": _REAL_HEADER.replace(b"\n", b",offered_tok_s_est,total_tok_s\n")
                             + b"llama-3.1-8b,ml_test,s,r,8-16-32,0.4-0.1-0.05,16,16,32,ok,1,222,197,1000,lots\n",
    # a row with one cell too many (every value one column left: its model read as 'ml_test'), a column named twice,
    # a max_lora_rank vLLM refuses, a negative rate whose sign the dashed form dropped, and an adapter split the
    # twin does not re-create (each re-created silently before)
    "real_extracell.csv": _REAL_HEADER + b"llama-3.1-8b,ml_test,s,r,8-16-32,0.4-0.1-0.05,16,16,32,ok,1,222,197,x\n",
    "real_dupcol.csv": _real_with("rates", "0.1-0.1-0.1"),
    "real_maxrank33.csv": _REAL_HEADER + b"llama-3.1-8b,ml_test,s,r,8-16-32,0.4-0.1-0.05,16,16,33,ok,1,222,197\n",
    "real_negrate.csv": _REAL_HEADER + b"llama-3.1-8b,ml_test,s,r,8-16-32,-0.4-0.1-0.05,16,16,32,ok,1,222,197\n",
    "real_split.csv": _real_with("adapters_per_rate", "1-1-14"),
    "real_status_empty.csv": _REAL_HEADER + b"llama-3.1-8b,ml_test,s,r,8-16-32,0.4-0.1-0.05,16,16,32,,1,222,197\n",
    # the server's gauges the report's diagnostics read: text (a pandas TypeError traceback), a KV usage above 1;
    # a row pasted twice (re-created and scored twice, as run_id#0 and #1)
    "real_gauge.csv": _real_with("ts_mean_running", "x"),
    "real_kvusage.csv": _real_with("ts_mean_kv_usage", "5"),
    "real_duprow.csv": _REAL_HEADER + b"llama-3.1-8b,ml_test,s,r,8-16-32,0.4-0.1-0.05,16,16,32,ok,1,222,197\n" * 2,
    "peer_text.csv": b"source,ranks,rates,served_adapters,adapter_slots,max_lora_rank,finished_requests,total_tok_s,"
                     b"itl_ms,ttft_ms_incl_unfinished\nml_test,8-16-32,0.4-0.1-0.05,16,16,32,lots,100,20,30\n",
})



@pytest.fixture
def files(tmp_path: Path) -> Path:
    for name, content in FILES.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(content)
    (tmp_path / "adir").mkdir()
    return tmp_path


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


R = "run --no-progress --duration 5 "
#: (command line, fragment of the error). ``{d}``: the directory of :data:`FILES`.
CASES: list[tuple[str, str]] = [
    # GPU memory and KV capacity
    (R + "--gpu-mem-gb 24", "--gpu-mem-gb 24: 24 GB of GPU memory (GiB, as GPUs state it) cannot hold llama-3.1-8b's "
                            "weights"),
    (R + "--gpu-mem-gb 10", "10 GB of GPU memory (GiB, as GPUs state it) cannot hold llama-3.1-8b's weights (15.0 GiB)"),
    # S-LoRA has no adapter slots: neither named nor offered as the fix (--slots is refused on it)
    (R + "--policy slora --gpu-mem-gb 20", "cannot hold llama-3.1-8b's weights (15.0 GiB) and the 4.66 GiB runtime "
                                           "reserve at 90% utilization: it needs more than 21.8 GiB; give a larger "
                                           "--gpu-mem-gb\n"),
    # the weights alone do not fit: fewer slots cannot help, so they are not offered as the fix
    (R + "--gpu-mem-gb 17", "at 90% utilization: it needs more than 24.8 GiB; give a larger --gpu-mem-gb\n"),
    (R + "--profile llama-2-13b_a100-24gb_vidur", "llama-2-13b's weights alone leave 0 tokens even without adapter "
                                                  "slots (llama-2-13b_a100-24gb_vidur), less than one --max-model-len "
                                                  "4096 request; vLLM would refuse to start: use a GPU with more "
                                                  "memory; or split the weights over more GPUs: --tp 2 holds it"),
    # under --gpu-mem-gb fewer slots can help: they stay the fix offered (not "the weights alone")
    (R + "--gpu-mem-gb 46.8 --slots 32 --ranks 128 --max-model-len 8192", "the KV cache holds 4528 tokens, less than "
                                                                         "one --max-model-len 8192 request "
                                                                         "(llama-3.1-8b, 32 adapter slots of rank 128);"
                                                                         " vLLM would refuse to start: lower "
                                                                         "--max-model-len (at most 4528), lower --slots"),
    (R + "--gpu-mem-gb 0", "--gpu-mem-gb 0: must be > 0"),
    (R + "--gpu-mem-gb 1e300", "--gpu-mem-gb 1e+300: more than 100000 (100 TB on one GPU)"),
    (R + "--gpu-mem-gb -80", "--gpu-mem-gb -80: must be > 0"),
    (R + "--gpu-mem-gb 40", "less than one --max-model-len 131072 request"),
    (R + "--gpu-mem-gb inf", "--gpu-mem-gb inf: must be a finite number"),
    (R + "--kv-tokens 0", "--kv-tokens 0: must be >= 1"),
    (R + "--kv-tokens 1000", "lower --max-model-len (at most 1000)"),
    (R + "--kv-tokens 1",
     "--kv-tokens 1: too small; vLLM needs a KV cache that holds at least one --max-model-len request (131072 tokens)"),
    (R + "--slots 64 --ranks 128", "vLLM would refuse to start"),
    # lists
    (R + "--ranks -8", "argument --ranks: values must be >= 1"),
    (R + "--ranks 8-128", "list the values with commas, e.g. 8,128"),
    (R + "--ranks 8,x", "'x' is not a valid int"),
    (R + "--ranks 0", "values must be >= 1"),
    (R + "--ranks ,", "--ranks: empty list"),
    (R + "--ranks 8,,16", "'8,,16' has an empty item"),
    (R + "--ranks 8,16,", "has an empty item"),
    ("compare --trace synthetic --policies vllm --rps 1,1 --duration 5", "--rps: 1.0 is given twice"),
    ("compare --trace synthetic --policies vllm,vllm --rps 1 --duration 5", "'vllm' is given twice"),
    ("compare --trace synthetic --policies vllm, --rps 1 --duration 5", "has an empty name"),
    # settings the engines refuse
    (R + "--max-lora-rank 33", "vLLM accepts only 8, 16, 32, 64, 128, 256, 320, 512 (LoRAConfig); give --max-lora-rank 64"),
    (R + "--system slora --slora-max-total-len 10", "(S-LoRA's max_req_input_len < max_req_total_len)"),
    (R + "--policy slora --kv-tokens 50", "longer than the pool of 50 tokens"),
    # 1e30 overflowed the token counts (numpy warnings) and drew 80 M lengths before the filter's error
    (R + "--trace-opt length_scale=1e30", "--trace-opt length_scale=1e+30: more than 10000: every length would exceed"),
    # a misspelt name gets the closest one (every name was listed, none pointed at)
    (R + "--policy chamelon", "unknown policy 'chamelon' (did you mean 'chameleon'?); available presets:"),
    (R + "--scheduler fcsf", "unknown scheduler 'fcsf' (did you mean 'fcfs'?)"),
    (R + "--cache lur", "unknown adapter-cache policy 'lur' (did you mean 'lru'?)"),
    (R + "--profile llama-3.1-8b_h100", "unknown profile 'llama-3.1-8b_h100' (did you mean 'llama-3.1-8b_h100_vllm085'?)"),
    (R + "--trace splitwse", "unknown trace 'splitwse' (did you mean 'splitwise'?)"),
    (R + "--system slor", "unknown serving system 'slor' (did you mean 'slora'?)"),
    # the option a tick interval comes from (it said "tick_interval is 0", no option of that name)
    (R + "--policy chameleon --scheduler-opt refresh_s=0", "option refresh_s = 0 (its tick interval); give seconds"),
    (R + "--policy fastlibra --cache-opt interval_s=0", "option interval_s = 0 (its tick interval); give seconds"),
    (R + "--policy slora --slora-max-prompt-len 5", "every prompt of the workload is longer than "
                                                     "--slora-max-prompt-len 5 (the shortest has"),
    # S-LoRA's start-up assert (api_server.py: batch_max_tokens >= max_req_total_len)
    (R + "--policy slora --slora-batch-max-tokens 10", "--slora-batch-max-tokens 10 is below --slora-max-total-len 3072: "
                                                       "S-LoRA refuses to start"),
    # times, rates, SLOs
    ("run --no-progress --horizon -5", "--horizon -5: must be > 0"),
    ("run --no-progress --horizon 0", "--horizon 0: must be > 0"),
    ("run --no-progress --horizon 1e12", "--horizon 1e+12: beyond the 1e+08 s (about 3 years) a run may simulate"),
    ("run --no-progress --trace {d}/epoch.csv",
     "--trace {d}/epoch.csv: the arrivals run from 1700000000 s to 1700000000.5 s, beyond the 1e+08 s"),
    ("run --no-progress --trace {d}/epoch.csv",
     "arrival_s looks like absolute (epoch) timestamps: rebase the arrivals to start at 0 (subtract the first, "),
    ("run --no-progress --trace {d}/huge.csv",
     "--trace {d}/huge.csv: the arrivals run from 0.5 s to 1e+300 s, beyond the 1e+08 s"),
    ("run --no-progress --duration 1e9 --rps 1e-6", "beyond the 1e+08 s (about 3 years) a run may simulate"),
    ("run --no-progress --trace {d}/late.csv --horizon 50",
     "--horizon 50: the first request of --trace {d}/late.csv arrives at 100 s, so nothing arrives before the horizon"),
    ("run --no-progress --duration 0", "--duration 0: must be > 0"),
    ("run --no-progress --duration -1", "--duration -1: must be > 0"),
    ("run --no-progress --rps 1e-9", "holds no request (with --rps 1e-09); lengthen --duration or raise --rps"),
    ("run --no-progress --duration 1e-9", "holds no request (with --duration 1e-09)"),
    ("traces synth --out {d}/w.parquet --rps 1e-9", "holds no request; lengthen --duration or raise --rps (nothing "
                                                    "written to {d}/w.parquet)"),
    ("run --no-progress --duration 1e12", "more than the 5,000,000 a run may generate"),
    ("run --no-progress --duration 1e5 --rps 1000", "more than the 5,000,000 a run may generate"),
    (R + "--trace-opt n_requests=100000000", "would hold n_requests=100000000 requests, more than the 5,000,000"),
    (R + "--rps 0", "--rps 0: must be > 0"),
    (R + "--rps -1", "--rps -1: must be > 0"),
    (R + "--rps nan", "--rps nan: must be a finite number"),
    # a data directory that is not one was ignored where the run read no data
    (R + "--data-dir {d}/nosuch", "--data-dir {d}/nosuch: does not exist; give the data directory"),
    (R + "--data-dir {d}/empty.csv", "--data-dir {d}/empty.csv: is a file; give the data directory"),
    # a value that starts like a negative number reaches its option (argparse said "expected one argument")
    ("configure predict --rates -0.4,0.05,0.1 --ranks 8,16,32", "-0.4 is not a rate; give per-adapter request rates"),
    ("sweep smoke --dry-run --shard -1/2", "--shard -1/2: give i/k with 0 <= i < k"),
    ("configure predict --rates 1e300,0.05,0.1 --ranks 8,16,32", "1e+300 req/s per adapter is beyond what the twin can "
                                                                 "simulate"),
    ("compare --policies vllm --rps 1,-1", "-1 is not a request rate (must be > 0)"),
    (R + "--ttft-slo -1", "--ttft-slo -1: must be > 0"),
    (R + "--tbt-slo 0", "--tbt-slo 0: must be > 0"),
    # server
    (R + "--tp 3", "--tp 3 does not divide llama-3.1-8b's 32 attention heads and 8 KV heads"),
    (R + "--tp 64", "use one of 1, 2, 4, 8, 16, 32"),
    (R + "--tp 0", "--tp 0: must be >= 1"),
    (R + "--slots 0", "--slots 0: must be >= 1"),
    (R + "--slots -1", "--slots -1: must be >= 1"),
    (R + "--adapters -3", "--adapters -3: must be >= 0"),
    (R + "--max-num-seqs 0", "--max-num-seqs 0: must be >= 1"),
    (R + "--max-batched-tokens 100", "--max-batched-tokens 100 is below --max-num-seqs 256"),
    (R + "--max-model-len 100", "every request of the workload is longer than --max-model-len 100"),
    (R + "--max-model-len 999999999", "exceeds llama-3.1-8b's context length 131072"),
    (R + "--max-model-len 0", "--max-model-len 0: must be >= 1"),
    (R + "--cpu-slots 2", "--cpu-slots 2 is below the 16 GPU adapter slots"),
    (R + "--slots 8 --cpu-slots 4", "--cpu-slots 4 is below --slots 8"),
    (R + "--max-lora-rank 8", "--max-lora-rank 8 is below the workload's largest adapter rank 32"),
    (R + "--seed -1", "--seed -1: must be >= 0"),
    # names
    (R + "--trace nosuch", "unknown trace 'nosuch'; built-in names: splitwise"),
    (R + "--policy nosuch", "unknown policy 'nosuch'; available presets:"),
    (R + "--scheduler nosuch", "unknown scheduler 'nosuch'; available: adapter-aware"),
    (R + "--cache nosuch", "unknown adapter-cache policy 'nosuch'; available: chameleon"),
    (R + "--profile nosuch", "unknown profile 'nosuch'; available: default"),
    (R + "--popularity foo", "--popularity: unknown popularity law 'foo'"),
    (R + "--trace-opt foo=1", "--trace-opt: unknown workload option 'foo'; known options: adapters"),
    (R + "--trace-opt cv=abc", "--trace-opt cv='abc'"),
    (R + "--trace-opt length_scale=-1", "--trace-opt length_scale=-1: must be >= 0"),
    (R + "--trace-opt novalue", "--trace-opt takes KEY=VALUE"),
    (R + "--trace-opt arrival=nosuch", "unknown arrival process 'nosuch'"),
    (R + "--trace-opt rps=3 --rps 2", "--trace-opt rps=... repeats --rps"),
    ("run --no-progress --trace-opt duration=0", "--trace-opt duration=0: must be > 0"),
    (R + "--trace-opt rps=0", "--trace-opt rps=0: must be > 0"),
    (R + "--trace-opt max_total=10", "rejects almost every draw of copula"),
    (R + "--trace-opt popularity=bad", "--trace-opt popularity: unknown popularity law"),
    (R + "--trace-opt window_start=5", "apply to real traces, not to the synthetic 'synthetic'"),
    ("run --no-progress --config {d}/slora_slots.toml", "--config {d}/slora_slots.toml: slots = 8: an option of the "
                                                         "vLLM engine, but the run is on the S-LoRA engine"),
    ("run --no-progress --config {d}/vllm_slora_opt.toml", "slora_max_prompt_len = 5: an option of the S-LoRA engine, "
                                                           "but the run is on the vLLM engine (preset 'vllm' runs on "
                                                           "vLLM), which does not read it (vLLM's limit is "
                                                           "--max-model-len); remove it from the file, or give "),
    ("run --no-progress --config {d}/sexagesimal.yaml", "max_num_seqs"),
    # adapter options on a workload without adapters change nothing
    ("run --no-progress --trace {d}/base_only.csv --ranks 8,64", "--ranks 8,64 has no effect: the workload serves the "
                                                                 "base model only ({d}/base_only.csv gives no request an "
                                                                 "adapter: no adapter_id column, or all -1); give "
                                                                 "--adapters N"),
    # the same on twin compare (its runs took them silently)
    ("compare --no-progress --policies vllm,chameleon --rps 1 --trace {d}/base_only.csv --seed 3 --out {d}/cmp",
     "twin compare: error: --seed 3 has no effect: {d}/base_only.csv is a workload file"),
    ("compare --no-progress --policies vllm --rps 1 --duration 5 --adapters 0 --ranks 8,16 --out {d}/cmp",
     "twin compare: error: --ranks 8,16 has no effect: the workload serves the base model only (--adapters 0)"),
    # a seed on a workload file replayed as written was recorded and changed nothing
    ("run --no-progress --trace {d}/base_only.csv --seed 3", "--seed 3 has no effect: {d}/base_only.csv is a workload "
                                                             "file, replayed as written (a seed only draws new adapters "
                                                             "for it, with --adapters N or --popularity)"),
    ("run --no-progress --trace {d}/base_only.csv --trace-opt length_scale=2", "{d}/base_only.csv: a workload file "
                                                                               "can only be rescaled (--rps), windowed"
                                                                               " (--duration, window_start) or get new "
                                                                               "adapters (--adapters, --ranks, "
                                                                               "--popularity); options ['length_scale']"
                                                                               " do not apply (its requests are "
                                                                               "replayed as the file gives them: edit "
                                                                               "the file instead)"),
    ("run --no-progress --trace {d}/conv_no_turn.csv", "conv_no_turn.csv: row 1 (line 2), column turn: a request of "
                                                       "conversation 1 without its turn (no turn column, or an empty "
                                                       "cell)"),
    (R + "--adapters 0 --popularity uniform", "--popularity uniform has no effect: the workload serves the base model "
                                              "only (--adapters 0)"),
    ("compare --trace {d}/burst.csv --policies vllm --rps 1,2 --slo 1", "burst.csv: cannot rescale to --rps 1 a trace "
                                                                       "whose 20 arrivals all share one timestamp"),
    (R + "--trace-opt length_scale=0.5 --trace-opt length_scale=2", "--trace-opt length_scale=... is given twice"),
    # a policy option of a scenario file that the policy given on the command line does not take: named as the file's
    ("run --no-progress --config {d}/opts_fcfs.toml --policy vllm", "--config {d}/opts_fcfs.toml [scheduler_options]: "
                                                                    "scheduler 'fcfs' takes no option(s) 'refresh_s'"),
    ("run --no-progress --config {d}/both_tables.toml", "--config {d}/both_tables.toml [scheduler_options] / "
                                                        "[cache_options]: scheduler 'chameleon'"),
    ("run --no-progress --config {d}/cache_table.toml --scheduler-opt slo_s=5", "--scheduler-opt / --config "
                                                                               "{d}/cache_table.toml [cache_options]: "
                                                                               "adapter-cache policy 'chameleon'"),
    ("run --no-progress --config {d}/bad_digest.toml", "--config {d}/bad_digest.toml: trace_sha256 = 'xyz' is not a "
                                                       "SHA-256 digest"),
    ("run --dump-config --out {d}/dc --plot", "--out / --plot with --dump-config: nothing is run or written (it "
                                               "prints the scenario and stops); leave them out"),
    ("run --bogus-flag", "twin run: error: --bogus-flag is not an option of twin run; see twin run --help"),
    # an option of another command: the closest name here, and the commands that take it
    ("compare --policies fcfs --rps 4 --policy fcfs", "twin compare: error: --policy is not an option of twin "
                                                      "compare (did you mean --policies?); it is an option of twin run,"),
    ("run --polcy fcfs --bogus", "--polcy is not an option of twin run (did you mean --policy?) (and --bogus)"),
    ("configure predict --rates 1,1,1 --ranks 8,8,8 --explian", "(did you mean --explain?)"),
    ("run --duration 5 fcfs", "twin run: error: unexpected argument 'fcfs': twin run takes no value there"),
    (R + "--rps fast", "argument --rps: expected a number, got 'fast'"),
    (R + "--slots 2.5", "argument --slots: expected an integer, got '2.5'"),
    # --trace FILE
    (R + "--trace {d}/nosuch.csv", "trace file {d}/nosuch.csv does not exist"),
    (R + "--trace {d}/empty.csv", "{d}/empty.csv: the file is empty"),
    (R + "--trace {d}/header.csv", "{d}/header.csv: the file holds no requests"),
    (R + "--trace {d}/header.jsonl", "{d}/header.jsonl: the file is empty"),
    (R + "--trace {d}/garbage.bin", "{d}/garbage.bin: a binary file, not a trace"),
    (R + "--trace {d}/garbage.csv", "{d}/garbage.csv: a binary file, not a trace"),
    (R + "--trace {d}/garbage.parquet", "{d}/garbage.parquet: not a readable trace or workload file"),
    (R + "--trace {d}/garbage.json", "{d}/garbage.json: a binary file"),
    (R + "--trace {d}/missing.csv", "{d}/missing.csv: missing column(s) output_tokens"),
    (R + "--trace {d}/extra.csv", "{d}/extra.csv: unknown column(s) adaptor_id"),
    (R + "--trace {d}/nonnum.csv", "{d}/nonnum.csv: row 2 (line 3), column prompt_tokens: 'abc' is not a number"),
    (R + "--trace {d}/neg.csv", "row 2 (line 3), column prompt_tokens: '-3' is below the minimum 1"),
    (R + "--trace {d}/nan.csv", "row 2 (line 3), column arrival_s: 'nan' is not a number"),
    (R + "--trace {d}/frac.csv", "row 1 (line 2), column prompt_tokens: '100.5' is not an integer"),
    (R + "--trace {d}/negarrival.csv", "row 1 (line 2), column arrival_s: '-1' is below the minimum 0"),
    (R + "--trace {d}/norank.csv", "requests name adapters (column adapter_id) but the file has no adapter_rank column"),
    (R + "--trace {d}/rank0.csv", "column adapter_rank: a request for adapter 3 needs adapter_rank >= 1"),
    (R + "--trace {d}/tworanks.csv", "row 2 (line 3), column adapter_rank: adapter 1 has rank 16 here"),
    (R + "--trace {d}/dupid.csv", "row 2 (line 3), column request_id: 1 repeats an earlier id"),
    (R + "--trace {d}/emptycell.csv", "row 1 (line 2), column prompt_tokens: empty"),
    (R + "--trace {d}/bad.jsonl", "{d}/bad.jsonl: row 2 (line 2), column prompt_tokens: 'x' is not a number"),
    (R + "--trace {d}/notobj.jsonl", "{d}/notobj.jsonl: line 2: expected a JSON object"),
    (R + "--trace {d}/broken.jsonl", "{d}/broken.jsonl: line 2: not valid JSON"),
    (R + "--trace {d}/bool.jsonl", "row 1 (line 1), column prompt_tokens: True is not a number"),
    (R + "--trace {d}/azure_header.csv", "{d}/azure_header.csv: the trace holds no requests"),
    (R + "--trace {d}/notrace.csv", "{d}/notrace.csv: unrecognised trace format"),
    (R + "--trace {d}/listcol.parquet", "{d}/listcol.parquet: row 1, column prompt_tokens: [5] is a list, not a "
                                        "number"),
    (R + "--trace {d}/noarrival.parquet", "{d}/noarrival.parquet: missing column(s) arrival_s (found prompt_tokens"),
    (R + "--trace {d}/adir", "{d}/adir: directory holds no trace files"),
    # --profile FILE
    (R + "--profile {d}/garbage.json", "profile file {d}/garbage.json is not a text file"),
    (R + "--profile {d}/empty.csv", "profile file {d}/empty.csv is empty"),
    (R + "--profile {d}/garbage.bin", "profile file {d}/garbage.bin is not a text file"),
    (R + "--profile {d}/list.json", "holds a JSON list, not a profile object"),
    (R + "--profile {d}/notprofile.json", "is not a LoRA Twin profile"),
    (R + "--profile {d}/brokenprofile.json", "is not a valid profile: missing key 'components'"),
    (R + "--profile {d}/nosuch.json", "profile file {d}/nosuch.json does not exist"),
    # --config FILE
    ("run --config {d}/garbage.toml", "--config {d}/garbage.toml: not a text file"),
    ("run --config {d}/text.toml", "--config {d}/text.toml: not valid TOML"),
    ("run --config {d}/empty.toml", "--config {d}/empty.toml: the file is empty"),
    ("run --config {d}/list.json", "expected a table of options, got list"),
    ("run --config {d}/badtype.toml", "--config {d}/badtype.toml: rps: --rps: expected a number, got 'fast'"),
    ("run --config {d}/unknownkey.toml", "unknown option(s) rpz; a scenario takes trace, rps"),
    # both spellings of one option: the last one won silently
    ("run --config {d}/twice.toml", "option max_num_seqs is given twice, as 'max-num-seqs' and 'max_num_seqs'; keep "
                                    "one"),
    ("run --config {d}/zero.toml", "--rps 0: must be > 0"),
    ("run --config {d}/ranks.toml", "list the values with commas"),
    ("run --config {d}/scenario.ini", "unknown scenario format '.ini'"),
    ("run --config {d}/nosuch.toml", "--config {d}/nosuch.toml: file not found"),
    ("run --config {d}/garbage.bin", "--config {d}/garbage.bin: not a text file"),
    # --out
    (R + "--out {d}/afile", "--out {d}/afile: is an existing file, not a directory"),
    (R + "--out {d}/afile/sub", "{d}/afile is a file, so no directory can be created under it"),
    (R + "--out ''", "--out: empty"),
    ("configure train {d}/adir --out {d}/afile/m.json", "--out {d}/afile/m.json: {d}/afile is a file"),
    ("configure evaluate --real {d}/real_served.csv --out {d}/afile", "--out {d}/afile: is an existing file"),
    ("configure dataset {d}/adir --out {d}/afile/l.csv", "--out {d}/afile/l.csv: {d}/afile is a file"),
    # twin traces
    ("traces show {d}/garbage.bin", "{d}/garbage.bin: a binary file, not a trace"),
    ("traces fetch splitwise-2024 --url file://{d}/empty.csv --data-dir {d}/data",
     "the download from file://{d}/empty.csv is empty (0 bytes); nothing was saved to {d}/data/traces/"),
    ("traces synth --out {d}/w.parquet --duration 5 --conversations --max-turns 0", "max_turns = 0: must be a finite "
                                                                                   "number > 0"),
    ("traces synth --out {d}/w.parquet --duration 5 --conversations --think-s -1", "think_s = -1.0: must be a finite "
                                                                                  "number >= 0"),
    ("traces synth --out {d}/w.parquet --duration 5 --arrival gamma --cv 1e9", "cv = 1e+09: at most 100"),
    # a file name for the committed fit's name: named, with the names there are (it read "x.json.json missing")
    ("traces synth --out {d}/w.parquet --duration 5 --arrival fitted --fit splitwise_conv_fit.json",
     "unknown fitted statistics 'splitwise_conv_fit.json' (a name, not a file: 'splitwise_conv_fit'); the committed"),
    (R + "--trace-opt arrival=gamma --trace-opt cv=1e9", "cv = 1e+09: at most 100"),
    (R + "--trace {d}/nanrank.csv", "row 2 (line 3), column adapter_rank: a request for adapter 2 needs "
                                    "adapter_rank >= 1"),
    ("sweep {d}/explode.toml --dry-run", "grid: 184,756 rate tuples, more than 100,000"),
    # (an unset shell variable: it excluded nothing, silently)
    ("sweep smoke --dry-run --exclude ''", "--exclude '': empty; give scenario keys"),
    ("sweep smoke --dry-run --exclude ' , '", "--exclude ' , ': empty"),
    ("sweep {d}/bigserved.toml --dry-run", "grid: its busiest run expects ~600,000,000 requests"),
    ("sweep {d}/lowrank.toml --dry-run", "grid [configs] max_lora_rank = [8]: below every scenario's largest rank"),
    ("configure dataset {d}/adir --ratio 2", "--ratio 2: must be at most 1"),
    ("configure dataset {d}/adir --ratio nan", "--ratio nan: must be a finite number"),
    ("configure dataset {d}/adir --tolerance -1", "--tolerance -1: must be >= 0"),
    ("configure dataset {d}/adir --slo-share 5", "--slo-share 5: must be at most 1"),
    ("configure train {d}/adir --cv 0", "--cv 0: the grid search needs at least 2 folds"),
    ("configure predict --rates 0.4,0.2 --ranks 8,16 --feature rate_max=nan", "the value must be a finite number"),
    ("calibrate fit --measurements {d}/adir --model llama-3.1-8b --folds 0", "--folds 0: the held-out scoring needs "
                                                                             "2 to 100 folds"),
    ("traces show {d}/header.csv", "{d}/header.csv: the file holds no requests"),
    ("traces synth --out {d}/afile/x.parquet --duration 5", "{d}/afile is a file"),
    ("traces synth --out {d}/w.csv --duration 5", "a workload is saved as Parquet"),
    ("traces synth --out {d}/w.parquet --duration 1e12", "more than the 5,000,000 a run may generate"),
    ("traces show synthetic --duration 5 --plot {d}/afile/x.png", "{d}/afile is a file"),
    ("traces show synthetic --duration 5 --bin-s 0", "--bin-s 0.0: must be > 0"),
    ("traces show synthetic --duration 5 --bin-s -1", "--bin-s -1.0: must be > 0"),
    (R + "--adapters 100000000", "more than the 1,000,000 adapters a workload may have"),
    ("calibrate report llama-3.1-8b_h100_vllm085 --out-dir {d}/afile",
     "--out-dir {d}/afile: is an existing file, not a directory"),
    ("calibrate replay --every 0", "--every 0: must be >= 1"),
    # twin compare
    ("compare --policies vllm --rps 1 --duration 5 --out {d}/afile", "--out {d}/afile: is an existing file, not a directory"),
    ("compare --policies vllm --rps 0 --duration 5", "argument --rps: 0 is not a request rate (must be > 0)"),
    ("compare --policies nosuch --rps 1 --duration 5", "unknown policies ['nosuch']"),
    ("compare --policies vllm --rps 1 --duration 5 --tp 3", "--tp 3 does not divide"),
    ("compare --policies vllm --rps 1 --duration 5 --slo -1", "--slo -1: must be > 0"),
    ("compare --policies vllm --rps 1 --duration 5 --slo-x 0", "--slo-x 0: must be > 0"),
    ("compare --policies vllm --rps 1 --duration 5 --unloaded-rps 0", "--unloaded-rps 0: must be > 0"),
    ("compare --policies chameleon --rps 1 --duration 5 --accuracy 2", "--accuracy 2: must be in [0, 1]"),
    ("compare --policies vllm --rps 1 --duration 5 --jobs 0", "--jobs 0: must be >= 1"),
    # twin calibrate
    ("calibrate report nosuch", "unknown profile 'nosuch'"),
    ("calibrate report llama-3.1-8b_h100_vllm085 --json --markdown", "--json and --markdown: give one of them"),
    ("calibrate report llama-3.1-8b_h100_vllm085 --no-figures --out-dir {d}/figs",
     "--out-dir {d}/figs with --no-figures: no figure would be drawn there"),
    # an empty --out-dir drew into the committed figures' directory, an empty --out of fit rewrote the shipped profile
    ("calibrate report llama-3.1-8b_h100_vllm085 --out-dir ''", "--out-dir: empty; give a directory"),
    ("calibrate report llama-3.1-8b_h100_vllm085 --out-dir {d}/afile/x", "--out-dir {d}/afile/x: {d}/afile is a file"),
    ("calibrate fit --measurements {d}/adir --model llama-3.1-8b --out ''", "--out: empty; give a file name"),
    ("calibrate fit --measurements {d}/adir --model llama-3.1-8b --out {d}/afile/p.json",
     "--out {d}/afile/p.json: {d}/afile is a file"),
    ("calibrate fit --measurements {d}/afile --model llama-3.1-8b --out {d}/p.json",
     "measurement directory {d}/afile is a file, not a directory"),  # (said "does not exist")
    # the fix named only the vLLM 0.8.5 tables, also for a Vidur fit (--gpu)
    ("calibrate fit --measurements {d}/nosuchdir --model llama-2-7b --gpu a40 --out {d}/p.json",
     "measurement directory {d}/nosuchdir does not exist; give --measurements the directory that holds the "
     "calibration tables: $TWIN_DATA_DIR/calibration/vllm085_h100 (vLLM 0.8.5), .../vllm050_h100_llama2 (vLLM 0.5.0) "
     "or .../vidur_linear_ops (Vidur's operator timings, with --gpu)"),
    ("calibrate fit --measurements {d}/adir --model llama-3.1-8b --out {d}/p.txt",
     "--out {d}/p.txt: give a .json file"),
    ("calibrate replay --out ''", "--out: empty; give a file name"),
    ("calibrate replay-offline --out ''", "--out: empty; give a file name"),
    ("calibrate replay-offline --seed -1", "--seed -1: must be >= 0"),
    ("calibrate report {d}/garbage.json", "profile file {d}/garbage.json is not a text file"),
    ("calibrate report {d}/list.json", "is not a LoRA Twin profile"),
    ("calibrate report llama-3.1-8b_h100_vllm085 --measurements {d}/nosuchdir", "--measurements {d}/nosuchdir: not a "
                                                                                 "directory"),
    # twin validate (no data needed: the errors come before the tables are read)
    ("validate --real {d}/garbage.bin --limit 1", "real-run table (--real) {d}/garbage.bin is not a text file"),
    ("validate --real {d}/empty.csv --limit 1", "real-run table (--real) {d}/empty.csv is empty"),
    ("validate --real {d}/header.csv --limit 1", "real-run table (--real) {d}/header.csv holds no runs"),
    ("validate --real {d}/notrace.csv --limit 1", "not a real-run validation table (missing columns"),
    ("validate --real {d}/nosuch.csv", "real-run table (--real) {d}/nosuch.csv does not exist"),
    ("validate --limit 0", "--limit 0: must be >= 1"),
    ("validate --jobs -1 --limit 1", "--jobs -1: must be >= 1"),
    ("validate --client-cap abc --limit 1", "--client-cap 'abc': give a number of requests"),
    ("validate --out {d}/afile --limit 1", "--out {d}/afile: is an existing file"),
    ("validate --real {d}/real_rates.csv", "{d}/real_rates.csv: row 1 (line 2), column rates: 'abc' is not a list of "
                                           "positive numbers (e.g. 0.4-0.05-0.00625)"),
    ("validate --real {d}/real_served.csv", "column served_adapters: -5 is not an integer >= 1"),
    ("validate --real {d}/real_slots.csv", "column adapter_slots: an empty cell is not an integer >= 1"),
    ("validate --real {d}/real_lengths.csv", "column pool_mean_input_tokens: 'long' is not a positive number"),
    ("validate --real {d}/real_maxrank.csv", "column max_lora_rank: 16 is below the run's largest adapter rank 32"),
    ("validate --real {d}/real_classes.csv", "column rates: '0.4-0.1-0.05' lists 3 classes for 2 served adapters"),
    ("validate --real {d}/real_nosource.csv", "column source: an empty cell names no subset (e.g. ml_test or dt_modelling)"),
    ("validate --real {d}/real_itl.csv", "column mean_itl_ms: -5 is not a measurement"),
    ("validate --real {d}/real_sent.csv", "column requests_sent: -3 is not a request count"),
    ("validate --real {d}/real_seqs.csv", "column max_num_seqs: 0 is not an integer >= 1"),
    ("validate --real {d}/real_cpu.csv", "column max_cpu_loras: 1 is below adapter_slots"),
    ("validate --real {d}/real_huge.csv", "more than the 5,000,000 a run may generate"),
    ("validate --real {d}/real_bttext.csv", "{d}/real_bttext.csv: row 1 (line 2), column benchmark_time_s: 'long' is "
                                            "not a measurement (leave the cell empty when it was not recorded)"),
    ("validate --real {d}/real_senttext.csv", "column requests_sent: 'many' is not a number"),
    ("validate --real {d}/real_senthalf.csv", "column requests_sent: 1200.5 is not a whole number of requests"),
    ("validate --real {d}/real_sentfew.csv", "column requests_sent: 100 is below the row's successful_requests 150: "
                                             "the client cannot finish more requests than it sent"),
    ("validate --real {d}/real_itltext.csv", "column mean_itl_ms: 'fast' is not a measurement"),
    ("validate --real {d}/real_btzero.csv", "column benchmark_time_s: 0 is not a benchmark window in seconds, > 0 and "
                                            "at most 1e+08"),
    ("validate --real {d}/real_bthuge.csv", "column benchmark_time_s: 1000000000000.0 is not a benchmark window"),
    ("validate --real {d}/real_seqshuge.csv", "column max_num_seqs: 1000000 is above the real runs' "
                                              "max_num_batched_tokens 2048"),
    ("validate --real {d}/real_longpool.csv --peer none", "{d}/real_longpool.csv: row 1 (line 2), column "
                                                          "pool_mean_output_tokens: 1000000000000.0 cannot be drawn by "
                                                          "the ShareGPT-like length model (target output mean 1e+12 is "
                                                          "not reachable"),
    ("validate --frontend-ms 1e7 --limit 1", "--frontend-ms 1e+07: more than 1e+06 (1,000 s per request)"),
    ("validate --scrape-us 1e7 --limit 1", "--scrape-us 1e+07: more than 1e+06 (1 s per label series)"),
    ("validate --serving-us 1e300 --limit 1", "--serving-us 1e+300: more than 1e+06 (1 s per running request and "
                                              "step)"),
    ("validate --rank-tile-cost 1e300 --limit 1", "--rank-tile-cost 1e+300: more than 100"),
    ("validate --out '' --limit 1", "--out: empty; give a directory"),
    (R + "--frontend-ms 1e300", "--frontend-ms 1e+300: more than 1e+06 (1,000 s per request)"),
    ("compare --policies vllm --rps 1 --duration 5 --serving-us 1e300", "--serving-us 1e+300: more than 1e+06"),
    ("compare --policies vllm --rps 1 --duration 5 --rank-tile-cost 1e3", "--rank-tile-cost 1000: more than 100"),
    ("compare --policies vllm --rps 1 --duration 5 --out ''", "--out: empty; give a directory"),
    ("compare --policies vllm --rps 1 --duration 5 --slo 1e300", "--slo 1e+300: beyond the 1e+08 s"),
    ("compare --policies vllm --rps 1 --duration 5 --slo-x 1e300", "--slo-x 1e+300: more than 10000 times"),
    ("compare --policies vllm --rps 1000 --unloaded-rps 1e-300 --duration 5",
     "the SLO's unloaded reference run (vllm at --unloaded-rps 1e-300 req/s) holds no request of --trace synthetic; "
     "raise --unloaded-rps"),
    ("validate --real {d}/real_status.csv", "none of the 1 selected runs of {d}/real_status.csv can be scored "
                                            "(statuses: weird 1)"),
    # twin configure, twin sweep
    ("configure search --rates 0.4 --ranks 8 --window -5 --cache {d}/sc", "--window -5: must be > 0"),
    ("configure search --rates 0.4 --ranks 8 --jobs 0 --cache {d}/sc", "--jobs 0: must be >= 1"),
    ("configure search --rates 0.4 --ranks 8 --served 16 --slots 32 --cache {d}/sc",
     "no configuration has slots <= served adapters"),
    ("configure predict --rates 0.4,0.1,0.05 --ranks 8,16,32 --adapters 0", "--adapters 0: must be >= 1"),
    ("configure predict --rates 0,0.1,0.05 --ranks 8,16,32", "--rates '0,0.1,0.05': 0 is not a rate"),
    ("configure predict --rates inf,0.1,0.05 --ranks 8,16,32", "--rates 'inf,0.1,0.05': inf is not a rate"),
    ("configure search --rates 0,0,0 --ranks 8 --cache {d}/sc", "--rates '0,0,0': 0 is not a rate"),
    ("configure search --rates 0.4,0.1 --ranks 8,1024 --served 16 --slots 16 --cache {d}/sc",
     "--ranks 1024: above 512, the largest --max-lora-rank vLLM accepts (8, 16, 32, 64, 128, 256, 320, 512; "
     "LoRAConfig): vLLM cannot serve such an adapter"),  # (it ran the walk: 1 start_failure, before)
    ("configure predict --rates 0.4,0.1,0.05 --ranks 8,16,32 --gpu-hour-usd -1", "--gpu-hour-usd -1: must be a price > 0"),
    ("configure predict --rates 0.4,0.1,0.05 --ranks 8,16,32 --model {d}/garbage.json",
     "{d}/garbage.json: not a configurator model (not valid JSON"),
    ("configure dataset {d}/notrace.csv", "{d}/notrace.csv: not a sweep's run table (missing columns"),
    ("sweep {d}/text.toml --out {d}/sw", "grid file {d}/text.toml: not valid TOML"),
    ("sweep {d}/list.json --out {d}/sw", "grid file {d}/list.json: expected a table of options, got list"),
    ("sweep smoke --shard 2/2 --out {d}/sw", "--shard 2/2: give i/k with 0 <= i < k"),
    ("configure evaluate --real {d}/real_served.csv --jobs 0", "--jobs 0: must be >= 1"),
    # workload options beyond what a workload may hold (adapters=1e9 exhausted the memory), negative rates,
    # unknown names that were silently ignored; integers written as huge floats
    (R + "--trace-opt adapters=1000000000", "--trace-opt adapters=1000000000: more than the 1,000,000 adapters a "
                                            "workload may have"),
    ("traces synth --out {d}/w.parquet --duration 5 --adapters 1000000000", "adapters = 1000000000: more than the "
                                                                            "1,000,000 adapters a workload may have"),
    (R + "--trace-opt rates=-1", "--trace-opt rates=-1: every per-adapter rate must be a finite number > 0"),
    ("traces synth --out {d}/w.parquet --duration 5 --rates 0.1,0", "rates = 0.1,0: every per-adapter rate must be "
                                                                    "a finite number > 0"),
    (R + "--trace-opt length_method=nosuch", "length_method = 'nosuch': unknown mean matching; use scale or tilt"),
    ("run --no-progress --duration 5 --config {d}/hugeslots.toml", "slots: --slots: 1e+308 is not an exact integer"),
    # sweep: a grid of empty runs, an engine override of an axis, --out a file / empty, --summary of a file
    ("sweep {d}/tinywindow.toml --dry-run", "grid: its busiest run expects ~2.4e-09 requests (8 adapters at a mean "
                                            "0.3 req/s each over window_s = 1e-09), so every run would hold no request"),
    ("sweep {d}/engineaxis.toml --dry-run", "grid [configs.engine] max_loras: set by the grid's slots axis for every "
                                            "run (the rows record that value); give it as [configs] slots = [...]"),
    ("sweep {d}/okgrid.toml --out {d}/afile --no-progress", "--out {d}/afile: is an existing file, not a directory"),
    ("sweep {d}/okgrid.toml --out '' --no-progress", "--out: empty; give a directory"),
    ("sweep {d}/okgrid.toml --summary --out {d}/afile", "--summary --out {d}/afile: a file, not a sweep's directory"),
    # configure evaluate: a table without the measured throughput (a bare KeyError 'offered_tok_s_est' before)
    ("configure evaluate --real {d}/real_unmeasured.csv --no-search", "{d}/real_unmeasured.csv: the real-run table "
                                                                      "lacks the measured column(s) offered_tok_s_est, "
                                                                      "total_tok_s"),
    ("configure evaluate --real {d}/real_textmeasured.csv --no-search", "row 1 (line 2), column total_tok_s: 'lots' is "
                                                                        "not a measurement"),
    ("compare --trace synthetic --policies vllm --rps 1,2 --duration 5 --unloaded-rps 50",
     "--unloaded-rps 50: the SLO's reference run must be unloaded, below the lowest swept rate"),
    ("compare --trace synthetic --policies fcfs --rps 1 --duration 5", "fcfs is a scheduler or cache, not a preset"),
    ("traces show synthetic --duration 5 --seed -1", "argument --seed: -1 is negative; give a seed >= 0"),
    # conversations: max_turns = 1e9 hung (an array of 1e9 turns), think_s = 1e300 raised numpy's "lam value too large"
    ("traces show synthetic --duration 5 --conversations --max-turns 1000000000", "its conversations start 5e+10 s "
                                                                                   "before the window"),
    ("traces show synthetic --duration 5 --conversations --think-s 1e300", "lower think_s or max_turns"),
    (R + "--trace-opt conversations=true --trace-opt max_turns=1000000000", "--trace-opt max_turns=1000000000: more "
                                                                            "than the 10,000 turns"),
    ("traces show synthetic --duration 5 --conversations --mean-turns 0.5", "mean_turns = 0.5: must be >= 1"),
    # a saved workload's empty window was shown as 0 requests; a NaN start was taken
    ("traces show {d}/late.csv --window-start 1e300", "{d}/late.csv: the time window holds no request (its arrivals "
                                                      "run from 100 s to 100.5 s)"),
    ("traces show {d}/late.csv --window-start nan", "workload option window_start=nan: give a finite number of "
                                                    "seconds >= 0"),
    ("traces show {d}/late.csv --plot ''", "--plot: empty; give a file name"),
    ("traces list --data-dir ''", "--data-dir: empty; give the data directory"),
    ("traces fetch splitwise --data-dir {d} --sha256 xyz", "--sha256 'xyz': not a SHA-256 digest"),
    ("traces fetch splitwise --data-dir {d} --timeout -1", "--timeout -1: must be a number of seconds > 0"),
    ("traces fetch splitwise --data-dir {d} --url ftp://x/y", "give an http://, https:// or file:// URL"),
    (R + "--trace-opt min_prompt=100 --trace-opt max_prompt=10", "min_prompt 100 is above max_prompt 10"),
    ("configure evaluate --real {d}/real_served.csv --no-search", "column served_adapters: -5 is not an integer >= 1"),
    ("configure evaluate --real {d}/real_status.csv --no-search", "none of the 1 rows of source 'ml_test' has status "
                                                                  "ok (statuses: weird 1)"),
    # options the selected arrival process, length model, conversation mode, engine or SLO does not read (silently
    # ignored before)
    (R + "--trace-opt cv=2", "workload option cv=2 has no effect with arrival=poisson (the default of synthetic preset "
                             "'synthetic'): it sets the inter-arrival coefficient of variation of the gamma renewal "
                             "process; give arrival=gamma (or fitted), or leave cv out"),
    (R + "--trace chameleon --trace-opt on_s=3", "workload option on_s=3 has no effect with arrival=poisson (the default "
                                                 "of synthetic preset 'chameleon'): it sets the mean on-period"),
    (R + "--trace-opt arrival=onoff --trace-opt rates=0.1,0.05", "workload option rates=0.1,0.05 has no effect with "
                                                                 "arrival=onoff: it sets the per-adapter Poisson rates; "
                                                                 "give arrival=per-adapter"),
    (R + "--trace-opt think_s=5", "workload option think_s=5 has no effect with conversations=false (the default of "
                                  "synthetic preset 'synthetic'): it sets the user think time between synthetic turns; "
                                  "give conversations=true"),
    (R + "--trace-opt length_method=tilt", "workload option length_method=tilt has no effect with lengths=splitwise"),
    (R + "--trace {d}/azure.csv --trace-opt cv=2", "workload option cv=2 has no effect: it sets the inter-arrival "
                                                   "coefficient of variation of the gamma renewal process, and trace "
                                                   "file {d}/azure.csv is replayed with its own arrival times"),
    ("traces synth --out {d}/w.parquet --duration 5 --arrival onoff --cv 2", "workload option cv=2 has no effect with "
                                                                             "arrival=onoff"),
    (R + "--slora-max-wait-tokens 3", "--slora-max-wait-tokens: an option of the S-LoRA engine, but the run is on the "
                                      "vLLM engine (preset 'vllm' runs on vLLM), which does not read it (vLLM's "
                                      "scheduler considers waiting requests at every step); leave --slora-max-wait-tokens "
                                      "out, or give --system slora (or a preset on S-LoRA, e.g. --policy slora)"),
    (R + "--no-slora-prefetch", "--slora-prefetch: an option of the S-LoRA engine, but the run is on the vLLM engine"),
    (R + "--policy vllm --slora-max-total-len 4096", "--slora-max-total-len: an option of the S-LoRA engine"),
    (R + "--policy chameleon --max-num-seqs 64", "--max-num-seqs: an option of the vLLM engine, but the run is on the "
                                                 "S-LoRA engine (preset 'chameleon' runs on S-LoRA), which does not read "
                                                 "it (S-LoRA caps the running requests by its running_max_req_size)"),
    (R + "--system slora --max-model-len 8192", "--max-model-len: an option of the vLLM engine, but the run is on the "
                                                "S-LoRA engine (--system slora), which does not read it (S-LoRA's limits "
                                                "are --slora-max-prompt-len and --slora-max-total-len); leave "
                                                "--max-model-len out, or give --system vllm"),
    (R + "--policy slora --cpu-slots 64", "--cpu-slots: an option of the vLLM engine"),
    (R + "--policy slora --max-batched-tokens 4096", "--max-batched-tokens: an option of the vLLM engine"),
    ("compare --policies vllm --rps 1 --duration 5 --slo 2 --slo-x 3",
     "--slo-x 3 with --slo 2: --slo sets the TTFT SLO itself, so no unloaded reference run is made and --slo-x (which "
     "scales its mean TTFT) would change nothing; give --slo, or --slo-x [--unloaded-rps] without --slo"),
    ("compare --policies vllm --rps 1 --duration 5 --slo 2 --unloaded-rps 0.1", "--unloaded-rps 0.1 with --slo 2"),
    ("compare --policies vllm,slora --rps 1 --duration 5 --accuracy 0.5",
     "--accuracy 0.5: no compared preset (vllm, slora) predicts output lengths, so it would change nothing"),
    ("compare --policies slora,chameleon --rps 1 --duration 5 --max-num-seqs 64",
     "--max-num-seqs: an option of the vLLM engine, but the run is on the S-LoRA engine (presets slora, chameleon all "
     "run on S-LoRA)"),
    ("compare --policies vllm --rps 1 --duration 5 --slora-max-wait-tokens 3",
     "or give --system slora (or add a preset on S-LoRA to --policies, e.g. slora)"),
    ("compare --policies vllm --rps 1 --duration 5 --system slora --max-num-seqs 4", "(--system slora)"),
    ("sweep {d}/sloraengine.toml --dry-run", "grid [configs.engine] slora_max_wait_tokens: an option of the S-LoRA "
                                             "engine (twin run --system slora), but a sweep runs every configuration on "
                                             "the vLLM engine, which does not read it; leave it out"),
    # adapter ranks beyond what the engine or the model serves (--ranks 100000 ran, or failed on the KV cache)
    (R + "--ranks 100000", "--ranks 100000: above 512, the largest --max-lora-rank vLLM accepts (8, 16, 32, 64, 128, "
                           "256, 320, 512; LoRAConfig): vLLM cannot serve such an adapter; give ranks of at most 512"),
    (R + "--ranks 8,1024 --kv-tokens 200000", "--ranks 1024: above 512"),
    (R + "--ranks 600 --max-lora-rank 512", "--ranks 600: above 512"),
    (R + "--system slora --ranks 100000", "--ranks 100000: above 4096, llama-3.1-8b's hidden size: a higher rank is no "
                                          "low-rank update of its layers; give ranks of at most 4096"),
    (R + "--trace-opt ranks=8,1024", "the workload's largest adapter rank 1024 is above 512, the largest "
                                     "--max-lora-rank vLLM accepts"),
    ("compare --policies vllm --rps 1 --duration 5 --ranks 100000", "--ranks 100000: above 512"),
    ("sweep {d}/bigrank.toml --dry-run", "grid [scenarios] ranks: rank 1024 is above 512, the largest --max-lora-rank "
                                         "vLLM accepts"),
    ("sweep {d}/bigmaxrank.toml --dry-run", "grid [configs] max_lora_rank: 1024 is above 512"),
    (R + "--trace {d}/trailing.csv", "{d}/trailing.csv: row 1 (line 2) has 4 cells but the header names 3 columns (a "
                                     "trailing comma?); give one cell per column"),
    (R + "--trace {d}/dupcol.csv", "{d}/dupcol.csv: the header names column 'arrival_s' twice; give every column once"),
    (R + "--trace {d}/baserank.csv", "{d}/baserank.csv: row 2 (line 3), column adapter_rank: 8 on a base-model "
                                     "request (adapter_id -1: no adapter); leave adapter_rank empty or 0 there"),
    (R + "--trace {d}/workload.json", "{d}/workload.json: the workload columns in a .json file; a workload is read "
                                      "from .parquet, .csv (a header row) or .jsonl"),
    (R + "--trace {d}/wdir", "{d}/wdir/a.csv: a workload file inside a directory; a directory is read as the parts of "
                             "one raw trace, so give the workload file itself (--trace {d}/wdir/a.csv)"),
    ("run --no-progress --config {d}/dupkey.yaml", "--config {d}/dupkey.yaml: key 'rps' is given twice (line 3); give "
                                                   "each option once"),
    ("run --no-progress --config {d}/dupkey.json", "--config {d}/dupkey.json: key 'rps' is given twice"),
    (R + "--profile ''", "--profile: empty; give a profile name (`twin calibrate list`) or a profile JSON file"),
    (R + "--data-dir ''", "--data-dir: empty; give the data directory"),
    ("compare --policies vllm --rps 1 --duration 5 --profile ''", "--profile: empty"),
    (R + "--popularity zipf:", "popularity 'zipf:': a ':' with no parameter after it"),
    ("validate --real {d}/real_extracell.csv", "real-run table (--real) {d}/real_extracell.csv: row 1 (line 2) has 14 "
                                               "cells but the header names 13 columns"),
    ("validate --real {d}/real_dupcol.csv", "{d}/real_dupcol.csv: the header names column 'rates' twice"),
    ("validate --real {d}/real_maxrank33.csv", "row 1 (line 2), column max_lora_rank: 33 is not a max_lora_rank vLLM "
                                               "accepts (8, 16, 32, 64, 128, 256, 320, 512; LoRAConfig)"),
    ("validate --real {d}/real_negrate.csv", "row 1 (line 2), column rates: '-0.4-0.1-0.05' is not a list of positive "
                                             "numbers"),
    ("validate --real {d}/real_split.csv", "row 1 (line 2), column adapters_per_rate: '1-1-14' is not how the twin "
                                           "splits 16 served adapters over 3 rate classes (round-robin: 6-5-5)"),
    ("configure evaluate --real {d}/real_extracell.csv --no-search", "has 14 cells but the header names 13 columns"),
    ("validate --real {d}/real_status_empty.csv", "(statuses: (empty) 1)"),
    ("validate --real {d}/real_gauge.csv", "{d}/real_gauge.csv: row 1 (line 2), column ts_mean_running: 'x' is not a "
                                           "measurement (leave the cell empty when it was not recorded)"),
    ("validate --real {d}/real_kvusage.csv", "column ts_mean_kv_usage: 5 is not a fraction of the KV cache (vLLM's "
                                             "gpu_cache_usage_perc gauge runs from 0 to 1)"),
    # a real-trace option the format's loader does not read (said "load_azure_llm() got an unexpected keyword")
    (R + "--trace {d}/azure.csv --trace-opt days=2", "option(s) ['days'] do not apply to azure-llm traces, whose loader "
                                                     "reads none of the real-trace options"),
    # a conversation dataset with malformed turns: these read as "option(s) [] do not apply to sharegpt traces"
    ("traces show {d}/conv_int.json", "{d}/conv_int.json: a conversation must be a list of messages (objects with "
                                      "'from' and 'value'), got int 5"),
    (R + "--trace {d}/conv_value.json", "{d}/conv_value.json: a message's 'value' must be text (a string), got int 5"),
    ("traces show {d}/conv_lacks.json", "{d}/conv_lacks.json: record 2 lacks 'conversations' (the first has it; every "
                                        "record needs it"),
    # conversation options on a replayed trace that holds no conversations, or that they do not shape (ran, and
    # changed nothing: only a conversation dataset's later turns are timed by think_s/tpot_s)
    (R + "--trace {d}/azure.csv --trace-opt tpot_s=0.05",
     "workload option tpot_s=0.05 has no effect: trace file {d}/azure.csv is an azure-llm trace of single requests, "
     "not a conversation dataset: it has no turns to count or time; think_s and tpot_s time the later turns of a "
     "replayed conversation dataset (--trace lmsys, chatbot-arena, sharegpt"),
    (R + "--trace {d}/azure.csv --trace-opt think_s=3 --trace-opt conversations=true",
     "workload options conversations=true, think_s=3 have no effect: trace file {d}/azure.csv is an azure-llm trace"),
    ("traces show {d}/azure.csv --max-turns 4", "workload option max_turns=4 has no effect: trace file {d}/azure.csv "
                                                "is an azure-llm trace of single requests"),
    ("compare --trace {d}/azure.csv --policies vllm --rps 1 --duration 5 --trace-opt think_s=3",
     "workload option think_s=3 has no effect: trace file {d}/azure.csv is an azure-llm trace"),
    (R + "--trace {d}/conv.json --trace-opt mean_turns=5", "workload option mean_turns=5 has no effect: trace file "
                                                           "{d}/conv.json is a sharegpt conversation dataset, replayed "
                                                           "with its own conversations and turns"),
    (R + "--trace {d}/conv.json --trace-opt conversations=false --trace-opt think_s=3",
     "workload option conversations=false has no effect: trace file {d}/conv.json is a sharegpt conversation dataset"),
    (R + "--trace {d}/conv.json --trace-opt turns=first --trace-opt think_s=2 --trace-opt tpot_s=0.05",
     "workload options think_s=2, tpot_s=0.05 have no effect with turns=first: trace file {d}/conv.json is then "
     "replayed with the first turn of each conversation only, so no later turn is timed; give turns=all"),
    ("run --no-progress --config {d}/oldsummary.json",
     "--config {d}/oldsummary.json: a run's summary (metrics such as requests_arrived) with no 'scenario' key instead "
     "of the table of the run's options"),
    ("run --no-progress --config {d}/strsummary.json", "with a str under 'scenario' instead of the table"),
    ("run --no-progress --config {d}/listopt.toml", "--config {d}/listopt.toml [trace_options] length_scale=[1]: a "
                                                    "list where one value belongs; multiply all lengths by this factor"),
    # real-trace option values: a tokenizer whose package is missing (an ImportError traceback), a count of 0 or
    # -1 conversations or a fractional one (read every conversation), a text where a count belongs ("'>=' not
    # supported between instances of 'int' and 'str'"), a keep_failed of "maybe" (taken as true)
    (R + "--trace {d}/conv.json --trace-opt tokenizer=hf:nosuch/model",
     "workload option tokenizer='hf:nosuch/model' needs the 'transformers' package"),
    (R + "--trace {d}/conv.json --trace-opt tokenizer=nosuch", "workload option unknown tokenizer 'nosuch': use auto, "
                                                               "approx, hf:NAME or tiktoken:NAME"),
    (R + "--trace {d}/conv.json --trace-opt max_conversations=0", "workload option max_conversations=0: give a whole "
                                                                  "number >= 1 (read at most this many conversations)"),
    (R + "--trace {d}/conv.json --trace-opt max_conversations=1.5", "max_conversations=1.5: give a whole number >= 1"),
    (R + "--trace {d}/conv.json --trace-opt max_conversations=abc", "max_conversations='abc': give a whole number"),
    (R + "--trace {d}/conv.json --trace-opt turns=2", "workload option turns=2: give all or first"),
    (R + "--trace {d}/azure.csv --trace-opt window_start=abc", "workload option window_start='abc': give a finite "
                                                               "number of seconds >= 0"),
    (R + "--trace {d}/azure.csv --trace-opt keep_failed=maybe", "workload option keep_failed: expected true or false, "
                                                                "got 'maybe'"),
    # window_start and n_requests where nothing reads them (a dataset without times, a re-timed trace, a trace of
    # single requests: all its requests were kept)
    (R + "--trace {d}/conv.json --trace-opt window_start=5",
     "workload option window_start=5 has no effect: trace file {d}/conv.json is a sharegpt dataset, which records no "
     "time, so its arrivals are drawn from the arrival process"),
    (R + "--trace {d}/azure.csv --trace-opt window_start=1 --trace-opt arrival=gamma",
     "window_start=1 has no effect: trace file {d}/azure.csv is re-timed by arrival=gamma"),
    ("traces show {d}/azure.csv --n-requests 1", "workload option n_requests=1 has no effect: trace file {d}/azure.csv "
                                                 "is an azure-llm trace of single requests, replayed with its own "
                                                 "requests"),
    # vLLM's adapter slots and padded rank on an S-LoRA run (ran, and changed nothing: S-LoRA has no slots)
    (R + "--policy slora --slots 4", "--slots: an option of the vLLM engine, but the run is on the S-LoRA engine "
                                     "(preset 'slora' runs on S-LoRA), which does not read it (S-LoRA has no adapter "
                                     "slots: its unified pool holds the adapters' weights with the KV cache); leave "
                                     "--slots out, or give --system vllm (or a preset on vLLM, e.g. --policy vllm)"),
    (R + "--policy chameleon --max-lora-rank 128", "--max-lora-rank: an option of the vLLM engine, but the run is on "
                                                   "the S-LoRA engine (preset 'chameleon' runs on S-LoRA)"),
    (R + "--system slora --max-lora-rank 64", "--max-lora-rank: an option of the vLLM engine, but the run is on the "
                                              "S-LoRA engine (--system slora), which does not read it (S-LoRA pads no "
                                              "adapter to a common rank: its kernels run each adapter at its own rank)"),
    ("compare --policies slora,chameleon --rps 1 --duration 5 --slots 8",
     "--slots: an option of the vLLM engine, but the run is on the S-LoRA engine (presets slora, chameleon all run on "
     "S-LoRA)"),
    # a KV cache larger than the whole GPU memory holds (ran with 100,000,000 tokens of KV on one H100)
    (R + "--kv-tokens 100000000", "--kv-tokens 100000000: more than the 379280 tokens the whole 64 GB of profile "
                                  "llama-3.1-8b_h100_vllm085_adaptercheck's GPU (H100-64GB) can hold (after llama-3.1-8b's weights "
                                  "and 16 adapter slots of rank 32, for vLLM's KV cache, even at "
                                  "--gpu-memory-utilization 1.0); the cache could not be allocated: give --kv-tokens "
                                  "379280 or less, or --gpu-mem-gb for a GPU with more memory, fewer --slots or a "
                                  "lower --max-lora-rank"),
    (R + "--kv-tokens 600000 --gpu-mem-gb 80", "--kv-tokens 600000: more than the 510352 tokens the whole 80 GB of "
                                               "GPU memory (--gpu-mem-gb) can hold"),
    (R + "--kv-tokens 300000 --gpu-mem-gb 10", "--gpu-mem-gb 10: 10 GB of GPU memory (GiB, as GPUs state it) cannot "
                                               "hold llama-3.1-8b's weights"),
    (R + "--policy slora --max-total-tokens 500000", "--max-total-tokens 500000: more than the 401744 tokens the "
                                                     "whole 64 GB of profile llama-3.1-8b_h100_vllm085_adaptercheck's GPU "
                                                     "(H100-64GB) can hold (after llama-3.1-8b's weights, for S-LoRA's "
                                                     "unified pool, even at --gpu-memory-utilization 1.0); the pool "
                                                     "could not be allocated: give --max-total-tokens 401744 or less"),
    (R + "--policy slora --kv-tokens 500000", "--kv-tokens 500000: more than the 401744 tokens"),
    # S-LoRA's pool sized twice (--max-total-tokens won, --kv-tokens was dropped without a word)
    (R + "--policy slora --kv-tokens 200000 --max-total-tokens 100000",
     "--kv-tokens 200000 and --max-total-tokens 100000 with the S-LoRA system (preset 'slora' runs on S-LoRA): both "
     "size S-LoRA's one pool of token slots (--max-total-tokens wins, --kv-tokens was ignored); give one of them"),
    ("compare --policies slora,chameleon --rps 1 --duration 5 --kv-tokens 200000 --max-total-tokens 100000",
     "--kv-tokens 200000 and --max-total-tokens 100000: every compared preset (slora, chameleon) runs on S-LoRA"),
    # a request count beside a window (5 requests over 2.5 s, --duration 1000 ignored)
    ("run --no-progress --trace-opt n_requests=5 --duration 1000",
     "workload options n_requests=5 and duration=1000: n_requests draws exactly that many requests instead of those "
     "of a window of duration seconds, so duration would have no effect; give one of them"),
    ("traces show synthetic --n-requests 5 --duration 1000", "workload options n_requests=5 and duration=1000"),
    # lengths scaled to the one-token floor (ran 1-token prompts and outputs)
    (R + "--trace-opt length_scale=1e-9", "--trace-opt length_scale=1e-09: less than 0.0001: every length under "
                                          "10,000 tokens would round to the one-token floor"),
    # SLOs no request could miss (--ttft-slo 1e308 ran and reported an attainment of 1)
    (R + "--ttft-slo 1e308", "--ttft-slo 1e+308: beyond the 1e+08 s (about 3 years) a run may simulate, so every "
                             "request would meet it; give a TTFT SLO in seconds, e.g. --ttft-slo 2"),
    (R + "--tbt-slo 1e9", "--tbt-slo 1e+09: beyond the 1e+08 s (about 3 years) a run may simulate"),
    (R + "--ttft-slo inf", "--ttft-slo inf: must be a finite number; give a TTFT SLO in seconds"),
    (R + "--tbt-slo nan", "--tbt-slo nan: must be a finite number"),
    (R + "--ttft-slo 100 --horizon 60", "--ttft-slo 100: beyond --horizon 60: no latency of the run can exceed the "
                                        "simulated time, so every request that finishes would meet it; give a TTFT SLO "
                                        "in seconds, e.g. --ttft-slo 2 (at most the horizon), or raise --horizon"),
]


def test_turn_timing_applies_to_a_replayed_conversation_dataset(files):
    """think_s and tpot_s time the later turns of a replayed conversation dataset (accepted, and read: a longer
    think time moves the second turn later); every conversation option is refused on a trace of single requests."""
    from traces.registry import OptionError, get_workload

    gaps = []
    for think in (1.0, 100.0):
        df = get_workload(str(files / "conv.json"), rps=1.0, duration=300.0, think_s=think, tpot_s=0.0).df
        by_turn = df.pivot_table(index="conversation_id", columns="turn", values="arrival_s").dropna()
        gaps.append(float((by_turn[1] - by_turn[0]).mean()))
    assert 0 < gaps[0] < 5 < 50 < gaps[1]
    with pytest.raises(OptionError, match="not a conversation dataset"):
        get_workload(str(files / "azure.csv"), tpot_s=0.05)


def test_options_that_apply_are_accepted():
    """The refusals of options nothing reads leave the combinations that do read them alone: a flag for
    the engine the preset runs on, a compared preset that reads it, --slo-x without --slo, and a workload
    option the preset's own settings read (fastlibra-translation: gamma arrivals)."""
    from traces.registry import get_workload
    from twin.cli import make_parser, resolve_run
    from twin.compare import CompareConfig, check_given

    for line in ("run --policy chameleon --slora-max-wait-tokens 3 --no-slora-prefetch",
                 "run --system slora --slora-max-total-len 4096 --ranks 4096",
                 "run --max-num-seqs 64 --cpu-slots 64 --ranks 512",
                 "run --policy vllm --slots 8 --max-lora-rank 128",
                 "run --ttft-slo 60 --tbt-slo 60 --horizon 60"):  # (an SLO at the horizon: the largest accepted)
        resolve_run(make_parser().parse_args(shlex.split(line)))
    run = RunConfig(trace="synthetic", duration=5.0)
    check_given(run, CompareConfig(policies=["vllm", "chameleon"], rps=[1.0], accuracy=0.5, slo=5.0),
                {"accuracy", "slo", "slora_max_wait_tokens", "max_num_seqs", "slots", "max_lora_rank"})
    check_given(run, CompareConfig(policies=["vllm"], rps=[1.0], slo_x=3.0, unloaded_rps=0.1), {"slo_x", "unloaded_rps"})
    assert len(get_workload("fastlibra-translation", duration=20.0, cv=3.0)) > 0
    assert len(get_workload("synthetic", duration=20.0, arrival="onoff", on_s=5.0, off_frac=0.5)) > 0


@pytest.mark.parametrize("line,fragment", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_a_clear_error(files, line, fragment):
    d = str(files)
    rc, out, err = run_cli(shlex.split(line.format(d=d)))
    assert rc == 2, (rc, out[-500:], err[-500:])
    assert fragment.format(d=d) in err, err
    assert "Traceback" not in err


DATA_CASES = [
    ("validate --filter 'nosuchcol == 3' --limit 1", "--filter 'nosuchcol == 3': not a valid query on the real-run "
                                                     "table (name 'nosuchcol' is not defined); columns: model, source"),
    ("validate --peer {d}/garbage.csv --limit 1", "published twin's table (--peer) {d}/garbage.csv is not a text file"),
    ("validate --peer {d}/notrace.csv --limit 1", "not a published twin's prediction table"),
    ("validate --peer {d}/peer_text.csv --limit 1", "{d}/peer_text.csv: row 1 (line 2), column finished_requests: "
                                                    "'lots' is not a number >= 0 (or empty)"),
    ("validate --filter 'source == 1 +' --limit 1", "not a valid query on the real-run table"),
    ("calibrate replay --out {d}/afile/x.csv", "--out {d}/afile/x.csv: {d}/afile is a file"),
    ("validate --filter 'adapter_slots = 3' --limit 1", "a query compares with '=='"),
    # a --vidur-dir without the timings silently fell back to the coarse estimate (the old hint, .../<gpu>/, led there)
    ("calibrate fit --measurements {data}/calibration/vllm050_h100_llama2 --model llama-2-7b --vidur-dir {d}/adir "
     "--out {d}/p.json", "--vidur-dir {d}/adir: no Vidur timings of llama-2-7b on h100 in {d}/adir"),
]


@pytest.mark.parametrize("line,fragment", DATA_CASES, ids=[c[0] for c in DATA_CASES])
def test_bad_validation_input_is_a_clear_error(real_data, files, line, fragment):
    d = str(files)
    rc, out, err = run_cli(shlex.split(line.format(d=d, data=real_data)))
    assert rc == 2 and fragment.format(d=d) in err, err
    assert not (files / "p.json").exists()


def test_committed_calibration_figures_are_not_replaced_without_measurements(tmp_path, monkeypatch, capsys):
    """Item 8: without the measurements, ``calibrate report`` refuses to overwrite the committed
    figures, and draws the curves only into a directory given with --out-dir."""
    from calibration.report import committed_figures_dir

    monkeypatch.setenv("TWIN_DATA_DIR", str(tmp_path / "no-data"))
    committed = committed_figures_dir("llama-3.1-8b_h100_vllm085")
    before = {p.name: p.stat().st_mtime_ns for p in committed.glob("*.png")}
    assert main(["calibrate", "report", "llama-3.1-8b_h100_vllm085"]) == 2
    err = capsys.readouterr().err
    assert "measurements of llama-3.1-8b_h100_vllm085 are not found" in err and "--out-dir DIR" in err
    assert {p.name: p.stat().st_mtime_ns for p in committed.glob("*.png")} == before
    assert main(["calibrate", "report", "llama-3.1-8b_h100_vllm085", "--out-dir", str(committed)]) == 2
    assert main(["calibrate", "report", "llama-3.1-8b_h100_vllm085", "--out-dir", str(tmp_path / "figs")]) == 0
    assert list((tmp_path / "figs").glob("*.png"))
    assert main(["calibrate", "report", "llama-3.1-8b_h100_vllm085", "--no-figures"]) == 0


def test_results_are_kept_when_writing_fails(tmp_path, monkeypatch):
    """A write that fails after the run: the summary is printed, the error names the path, exit 2."""
    import twin.simulate

    def fail(self, out_dir):
        raise PermissionError(13, "Permission denied", str(Path(out_dir) / "requests.parquet"))

    monkeypatch.setattr(twin.simulate.SimResult, "write", fail)
    rc, out, err = run_cli(["run", "--no-progress", "--duration", "5", "--out", str(tmp_path / "o")])
    assert rc == 2 and "throughput (req/s)" in out
    assert f"could not write the results to {tmp_path / 'o' / 'requests.parquet'} (Permission denied)" in err


@pytest.mark.parametrize("rates,fragment", [
    ("1,1e-9", "holds no request (with --duration 5, --rps 1e-09)"),
    ("1,1e9", "more than the 5,000,000 a run may generate"),
])
def test_compare_refuses_a_bad_rate_before_any_run(monkeypatch, rates, fragment):
    """A swept rate whose workload is empty or too large used to fail only when its turn came, after
    the rates before it were simulated."""
    import twin.compare

    monkeypatch.setattr(twin.compare, "simulate", lambda *a, **k: pytest.fail("simulated before the check"))
    rc, out, err = run_cli(["compare", "--policies", "vllm", "--rps", rates, "--duration", "5", "--slo", "1"])
    assert rc == 2 and fragment in err, err


def test_empty_download_leaves_no_file(files):
    """``traces fetch`` of an empty file (no pinned digest): refused, and nothing is saved."""
    rc, _, err = run_cli(["traces", "fetch", "splitwise-2024", "--url", (files / "empty.csv").as_uri(),
                            "--data-dir", str(files / "data")])
    assert rc == 2 and "is empty (0 bytes)" in err
    assert not [p for p in (files / "data").rglob("*") if p.is_file()]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
@pytest.mark.parametrize("line", [
    "run --no-progress --duration 5 --out /proc/x",
    "configure train {d}/adir --out /proc/x/m.json",
    "configure evaluate --real {d}/real_served.csv --no-search --out /proc/x",
])
def test_unwritable_out_is_refused_before_any_work(files, line):
    """``--out`` where nothing can be created (``/proc``: writable by its mode bits for root) is
    refused before the run, the training or the evaluation, not after it."""
    rc, out, err = run_cli(shlex.split(line.format(d=files)))
    assert rc == 2 and "--out /proc/x" in err and "give a path you can write to" in err, err
    assert out == "" and "Traceback" not in err


def test_compare_gives_slots_to_its_vllm_presets_only():
    """``twin compare --policies vllm,slora --slots 8``: the vLLM preset runs with the slots (and
    ``--max-lora-rank``), the S-LoRA preset without them (it has none), so neither is refused."""
    from twin.scenario import for_preset

    run = RunConfig(trace="synthetic", duration=5.0, slots=8, max_lora_rank=64)
    assert (for_preset(run, "vllm").slots, for_preset(run, "vllm").max_lora_rank) == (8, 64)
    assert (for_preset(run, "slora").slots, for_preset(run, "slora").max_lora_rank) == (None, None)


def test_kv_tokens_up_to_what_the_memory_holds_are_accepted():
    """The largest ``--kv-tokens`` accepted is what the whole GPU memory holds after the weights (and vLLM's
    slot buffers) at utilization 1.0 with no runtime reserve (the profile's GPU, ``H100-64GB``, or
    ``--gpu-mem-gb``): more than the profile's own capacity at vLLM's default 0.9 is accepted (a server run
    at a higher ``--gpu-memory-utilization``); one token beyond the bound is refused."""
    from twin.perf.profile import gpu_memory_gb, load_profile
    from twin.scenario import build_engine_config, build_workload
    from twin.tensor_parallel import kv_tokens_for_memory

    prof = load_profile(None)
    assert gpu_memory_gb(prof.gpu) == 64.0
    run = RunConfig(trace="synthetic", duration=5.0)
    w = build_workload(run)
    slots = run.adapter_slots(int(w.df["adapter_id"].max()) + 1)
    rank = int(w.df["adapter_rank"].max())
    whole = dict(utilization=1.0, runtime_overhead_gb=0.0)
    for extra, most in (({}, kv_tokens_for_memory(prof, 64.0, slots, rank, **whole)),
                        ({"gpu_mem_gb": 80.0}, kv_tokens_for_memory(prof, 80.0, slots, rank, **whole)),
                        ({"policy": "slora"}, kv_tokens_for_memory(prof, 64.0, 0, 0, **whole))):
        assert most > prof.kv_capacity_tokens(slots, rank)
        ok = dataclasses.replace(run, kv_tokens=most, **extra)
        assert build_engine_config(ok, w, prof).kv_capacity_tokens == most
        with pytest.raises(ConfigError, match=f"--kv-tokens {most + 1}: more than the {most} tokens"):
            build_engine_config(dataclasses.replace(ok, kv_tokens=most + 1), w, prof)


def test_tp_hint_only_for_memory_problems():
    """The ``--tp`` hint follows a KV cache too small for the weights, not other start-up errors;
    ``--kv-tokens`` too small says so instead of asking for ``--kv-tokens``."""
    rc, _, err = run_cli(shlex.split(R + "--max-model-len 10"))
    assert rc == 2 and "longer than --max-model-len 10" in err and "--tp" not in err, err
    rc, _, err = run_cli(shlex.split(R + "--kv-tokens 1"))
    assert rc == 2 and "give --kv-tokens 131072 or more" in err, err
    assert "set --kv-tokens" not in err and "--tp" not in err, err
    rc, _, err = run_cli(shlex.split(R + "--slots 64 --ranks 128"))
    assert rc == 2 and "or split the weights over more GPUs: --tp 2 holds it" in err, err


def test_epoch_trace_runs_in_the_window_the_error_suggests(files):
    """The fix the epoch-timestamp error gives (a window from the first arrival) runs, from 0."""
    rc, out, err = run_cli(["run", "--no-progress", "--json", "--trace", str(files / "epoch.csv"),
                            "--trace-opt", "window_start=1700000000"])
    s = json.loads(out)
    assert rc == 0 and s["requests_finished"] == 2 and s["simulated_s"] < 10, err


def test_smaller_gpu_gives_smaller_kv(capsys):
    kv = []
    for gb in (80, 60, 48):
        rc, out, err = run_cli(["run", "--no-progress", "--duration", "5", "--gpu-mem-gb", str(gb),
                                "--max-model-len", "8192", "--json"])
        assert rc == 0, err
        kv.append(json.loads(out)["kv_capacity_tokens"])
    assert kv[0] > kv[1] > kv[2] > 0


def test_base_model_only_with_zero_adapters():
    """``--adapters 0`` is a documented set-up (the base model only), not an error."""
    rc, out, err = run_cli(["run", "--no-progress", "--duration", "5", "--adapters", "0", "--json"])
    s = json.loads(out)
    assert rc == 0 and s["requests_arrived"] > 0 and s["adapter_loads"] == 0


# --------------------------------------------------------------------------- property-based
FLAG_VALUES = {
    "--rps": st.sampled_from(["2", "0", "-1", "nan", "inf", "1e9", "0.5", "x"]),
    "--duration": st.sampled_from(["2", "0", "-1", "1e12", "nan", "3"]),
    "--horizon": st.sampled_from(["5", "0", "-5", "inf"]),
    "--adapters": st.sampled_from(["0", "1", "5", "-3", "2.5"]),
    "--ranks": st.sampled_from(["8", "8,16", "8-128", "-8", "0", "", "x", "8,,16"]),
    "--popularity": st.sampled_from(["uniform", "zipf:1.2", "foo", "U-P", ""]),
    "--trace-opt": st.sampled_from(["length_scale=0.5", "foo=1", "cv=abc", "novalue", "lengths=sharegpt",
                                    "length_scale=-1", "=3", "arrival=gamma", "duration=2", "rps=0",
                                    "n_requests=1e9", "max_total=10"]),
    "--seed": st.sampled_from(["0", "1", "-1", "x"]),
    "--policy": st.sampled_from(["vllm", "slora", "nosuch", "chameleon"]),
    "--scheduler": st.sampled_from(["fcfs", "sjf", "nosuch"]),
    "--cache": st.sampled_from(["lru", "none", "nosuch"]),
    "--profile": st.sampled_from(["default", "nosuch", "qwen-2.5-7b_h100_vllm085", "{file}"]),
    "--slots": st.sampled_from(["1", "4", "0", "-1", "64"]),
    "--cpu-slots": st.sampled_from(["1", "100", "0"]),
    "--max-lora-rank": st.sampled_from(["8", "128", "0"]),
    "--max-model-len": st.sampled_from(["100", "8192", "0", "999999999"]),
    "--max-num-seqs": st.sampled_from(["1", "256", "0"]),
    "--max-batched-tokens": st.sampled_from(["100", "2048", "0"]),
    "--gpu-mem-gb": st.sampled_from(["24", "80", "0", "-80", "nan"]),
    "--kv-tokens": st.sampled_from(["0", "1000", "300000"]),
    "--tp": st.sampled_from(["1", "2", "3", "0"]),
    "--ttft-slo": st.sampled_from(["1", "-1", "0"]),
    "--tbt-slo": st.sampled_from(["0.1", "0"]),
    "--trace": st.sampled_from(["synthetic", "chameleon", "nosuch", "{file}", "sharegpt-synth"]),
    "--config": st.sampled_from(["{file}"]),
    "--out": st.sampled_from(["{file}", "{file}/sub", "{tmp}/out"]),
}
TOKENS = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=8)
FILE_SUFFIXES = [".csv", ".jsonl", ".parquet", ".json", ".toml", ".yaml", ".bin"]


@st.composite
def file_contents(draw) -> bytes:
    kind = draw(st.sampled_from(["bytes", "csv", "jsonl", "toml", "json", "empty"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "empty":
        return b""
    cols = draw(st.lists(st.sampled_from(["arrival_s", "prompt_tokens", "output_tokens", "adapter_id",
                                          "adapter_rank", "request_id", "x"]), min_size=1, max_size=5, unique=True))
    cells = st.sampled_from(["0", "1", "2.5", "-1", "nan", "", "abc", "100", "1e30", "3"])
    rows = draw(st.lists(st.lists(cells, min_size=len(cols), max_size=len(cols)), max_size=4))
    if kind == "csv":
        return (",".join(cols) + "\n" + "".join(",".join(r) + "\n" for r in rows)).encode()
    if kind == "jsonl":
        return "".join(json.dumps(dict(zip(cols, r))) + "\n" for r in rows).encode()
    keys = draw(st.lists(st.sampled_from(["rps", "duration", "ranks", "slots", "trace", "horizon", "nosuch",
                                          "trace_options", "max_num_seqs", "seed"]), max_size=4, unique=True))
    vals = st.sampled_from(['2', '0', '-1', '"x"', '[8, 16]', '"8-128"', 'true', '{length_scale = 0.5}', '1.5',
                            '"synthetic"', '3'])
    pairs = [(k, draw(vals)) for k in keys]
    if kind == "toml":
        return "".join(f"{k} = {v}\n" for k, v in pairs).encode()
    return ("{" + ", ".join(f'"{k}": {v.replace(" = ", ": ").replace("length_scale", chr(34) + "length_scale" + chr(34))}'
                            for k, v in pairs) + "}").encode()


@st.composite
def argument_lists(draw, tmp: Path) -> tuple[list[str], Path]:
    """A random ``twin run`` command line (always a tiny --duration and --horizon) and its file."""
    path = tmp / f"input{draw(st.sampled_from(FILE_SUFFIXES))}"
    path.write_bytes(draw(file_contents()))
    argv = ["run", "--no-progress", "--json"]
    if draw(st.booleans()):  # the random file through one of the file arguments
        argv += [draw(st.sampled_from(["--trace", "--config", "--profile"])), str(path)]
    for _ in range(draw(st.integers(0, 4))):
        choice = draw(st.integers(0, 9))
        if choice == 0:
            argv.append(draw(TOKENS))  # a stray token or unknown flag
        elif choice == 1:
            argv.append("--" + draw(st.text(alphabet="abcdefgh-", min_size=1, max_size=8)))
        else:
            flag = draw(st.sampled_from(sorted(FLAG_VALUES)))
            argv += [flag, draw(FLAG_VALUES[flag]).format(file=path, tmp=tmp)]
    argv += ["--duration", draw(st.sampled_from(["2", "3"])), "--horizon", "20"]
    return argv, path


def classify(argv: list[str]) -> str | None:
    """Our own validators' verdict on the flags parsed (None: valid as far as check_run sees)."""
    from traces.flags import from_namespace
    from twin.cli import make_parser

    try:
        with redirect_stderr(io.StringIO()):
            args = make_parser().parse_args(argv)
    except SystemExit:
        return "argparse"
    if args.config:
        return None  # the file's options are checked by the run itself
    try:
        check_run(from_namespace(RunConfig, args))
    except (ConfigError, ValueError, KeyError) as e:
        return str(e)
    return None


@settings(max_examples=60, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_random_command_lines_never_crash(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("prop")
    argv, _ = data.draw(argument_lists(tmp))
    verdict = classify(argv)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(argv)  # no exception may escape
    assert rc in (0, 2), (argv, rc, err.getvalue()[-800:])
    assert "Traceback" not in err.getvalue()
    if verdict is not None:
        assert rc == 2, (argv, verdict)
    if rc == 2:
        assert err.getvalue().strip(), argv  # an error is never silent
    else:
        s = json.loads(out.getvalue())
        assert s["requests_arrived"] == s["requests_finished"] + s["requests_rejected"] + s["requests_unfinished"]


@pytest.mark.parametrize("edit,fragment", [
    (("backbone", "c_mem", float("nan")), "components.backbone.params.c_mem is nan; every constant of a profile must "
                                          "be a finite number"),
    (("backbone", "c0", -5.0), "components.backbone.params.c0 is -5.0 s; a base-model time must be >= 0"),
    # hidden by the roofline's memory floor: a 2048-token prefill priced at 16 ms
    (("backbone", "c_tok", -0.01), "components.backbone.params.c_tok is -0.01 s/token; a base-model time must be"),
    # a negative LoRA constant: a run that ended at once with 0 requests arrived, or TTFTs below the base model's
    (("lora", "l0", -0.1), "the LoRA time of one decode token of one rank-8 adapter in 1 slot is -0.099"),
    (("scheduler", "k0", -1.0), "the scheduler time of one decode token is -0.99"),
    # 300-digit latencies
    (("backbone", "c0", 1e300), "the step time of one decode token is 1e+300 s, not a duration in (0, 60] s"),
])
def test_profile_with_nonsense_constants_is_refused(tmp_path, edit, fragment):
    """A NaN constant used to hang the engine's loop; a negative intercept ran the clock backwards."""
    from twin.perf.profile import load_profile

    d = load_profile("llama-3.1-8b_h100_vllm085").to_dict()
    comp, key, value = edit
    assert key in d["components"][comp]["params"]
    d["components"][comp]["params"][key] = value
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(d))
    rc, out, err = run_cli(["run", "--no-progress", "--duration", "5", "--profile", str(path)])
    assert rc == 2 and fragment in err, err
    assert "Traceback" not in err


def _edit(path: str, value):
    """An edit of a profile dict: ``value`` set at the dotted ``path`` (``...`` deletes the key)."""
    def apply(d: dict) -> None:
        *head, last = path.split(".")
        for k in head:
            d = d[k]
        if value is ...:
            del d[last]
        else:
            d[last] = value
    return apply


@pytest.mark.parametrize("path,value,fragment", [
    # a constant of the wrong JSON type: `true` ran as 1 s per token; "0.00002" was read as the number; the others
    # read as "float() argument must be a string or a real number, not 'list'" with no key named
    ("components.backbone.params.c_tok", True, "components.backbone.params.c_tok is true (a JSON boolean), not a "
                                               "number; every constant of a profile must be a finite number (written "
                                               "without quotes)"),
    ("components.backbone.params.c_tok", "0.00002", "components.backbone.params.c_tok is the text '0.00002', not a "
                                                    "number"),
    ("components.backbone.params.c_tok", [1], "components.backbone.params.c_tok is a JSON list, not a number"),
    ("components.backbone.params.c_tok", None, "components.backbone.params.c_tok is null, not a number"),
    ("components.load.params.table_s.disk.8", "x", "components.load.params.table_s.disk.8 is the text 'x'"),
    # the shape: "'str' object has no attribute 'get'", "'list' object has no attribute 'items'", "known forms: []"
    ("components.backbone", "graph_roofline", "components.backbone is the text 'graph_roofline'; give an object "
                                              "{\"form\": ..., \"params\": {...}}"),
    ("components", [1, 2], "components is a JSON list; give an object of components (backbone, lora, scheduler, load, "
                           "kv, mixed, adapter_check)"),
    ("components.bogus", {"form": "x", "params": {}}, "unknown component 'bogus'; a profile has backbone, lora, "
                                                      "scheduler, load, kv (and optionally mixed, adapter_check)"),
    ("components.backbone.params", [1], "components.backbone.params is a JSON list; give an object of the form's "
                                        "constants by name"),
    # a misspelt (optional) parameter ran at its default
    ("components.lora.params.split64cost", 0.5, "components.lora.params: unknown parameter(s) ['split64cost'] of form "
                                                "'kernel_grid', which reads ['graph_max_tokens', 'hidden'"),
    # zero or negative divisors: a ZeroDivisionError traceback, SimPy's bare "Negative delay -0.33" mid-run, a KV
    # cache of 0 tokens blamed on the weights with a --tp hint
    ("components.kv.params.kv_bytes_per_token", 0, "components.kv.params.kv_bytes_per_token is 0; a KV token's bytes "
                                                   "must be > 0 (refit it with `twin calibrate fit`)"),
    ("components.kv.params.kv_bytes_per_token", -1, "kv_bytes_per_token is -1; a KV token's bytes must be > 0"),
    ("components.load.params.cpu_gbps", 0, "components.load.params.cpu_gbps is 0; the CPU -> GPU bandwidth (GB/s) "
                                           "must be > 0"),
    ("components.load.params.disk_fixed_s", -1, "disk_fixed_s is -1; a load's fixed time from disk (s) must be >= 0"),
    ("components.load.params.table_s.disk.8", -1, "components.load.params.table_s.disk.8 is -1; a load time must "
                                                  "be >= 0 s"),
    ("components.load.params.table_s.floppy", {"8": 0.1}, "components.load.params.table_s: unknown source 'floppy'"),
    ("components.load.params.table_s.disk.eight", 0.1, "components.load.params.table_s.disk: key 'eight' is not a "
                                                       "LoRA rank"),
    ("components.lora.params.layers", 0, "components.lora.params.layers is 0; a dimension of the model must be a whole "
                                         "number >= 1"),
    ("components.lora.params.layers", 2.5, "components.lora.params.layers is 2.5"),
    # sizes beyond any model or GPU, and signs the memory model needs: 1e15 layers ran; a negative slot size gave a KV
    # cache of 3.9 billion tokens; a 1e-300-byte KV token failed as "cannot convert float NaN to integer"
    ("components.lora.params.layers", 1e15, "components.lora.params.layers is 1000000000000000.0; beyond 1e+08, no model's "
                                            "dimension"),
    ("components.kv.params.slot_bytes_per_rank", -1e12, "components.kv.params.slot_bytes_per_rank is -1000000000000.0; "
                                                        "an adapter slot's bytes per rank must be >= 0"),
    ("components.kv.params.free_bytes", 1e300, "components.kv.params.free_bytes is 1e+300; memory for the KV cache "
                                               "beyond 1e+15 bytes"),
    ("components.kv.params.kv_bytes_per_token", 1e-300, "kv_bytes_per_token is 1e-300; a KV token takes at least a "
                                                        "byte"),
    ("components.lora.params.split64_cost", -0.5, "components.lora.params.split64_cost is -0.5; a 64-split block's "
                                                  "cost"),
    ("components.backbone.params.graph_max_tokens", -5, "graph_max_tokens is -5; a token count must be a whole number "
                                                        ">= 0"),
    # the model and the targets: 'missing key "unknown model ..."', "unknown LoRA target module 'q'" (a string
    # iterated), an empty list ran adapters of 0 bytes
    ("model", "nosuch-model", "is not a valid profile: model: unknown model 'nosuch-model'; known models: "),
    ("model", 5, "model is a JSON int; give the profile's model as text (e.g. llama-3.1-8b)"),
    # read as text by --gpu-mem-gb's default (a TypeError traceback)
    ("gpu", 5, "gpu is a JSON int; give it as text (e.g. 'H100-64GB') or leave it out"),
    # a GPU whose memory cannot hold the profile's weights and KV memory (it ran with 37 GB of KV on "8 GB")
    ("gpu", "H100-8GB", "gpu 'H100-8GB' names 8 GB, less than llama-3.1-8b's weights (16.1 GB) and the KV memory of "
                        "components.kv.params.free_bytes"),
    ("lora_targets", "q_proj", "lora_targets is the text 'q_proj'; give a list of the modules the adapters adapt"),
    ("lora_targets", [], "lora_targets is an empty list"),
    ("lora_targets", ["nosuch_proj"], "lora_targets names unknown module 'nosuch_proj'; choose from q_proj"),
])
def test_hand_edited_profile_is_refused_naming_the_key(tmp_path, path, value, fragment):
    from twin.perf.profile import load_profile

    d = copy.deepcopy(load_profile("llama-3.1-8b_h100_vllm085").to_dict())  # (to_dict shares the cached tables)
    _edit(path, value)(d)
    p = tmp_path / "edited.json"
    p.write_text(json.dumps(d))
    rc, out, err = run_cli(["run", "--no-progress", "--duration", "5", "--ranks", "64", "--profile", str(p)])
    assert rc == 2 and fragment in err and out == "", err
    assert f"profile file {p} is not a valid profile: " in err and err.count(str(p)) == 1, err  # (named once)
    assert "Traceback" not in err


def test_every_shipped_profile_passes_the_profile_checks():
    """The checks of a hand-edited profile accept every shipped one and its round trip (a model one GPU cannot
    hold, free_bytes < 0, included: it is served with --tp)."""
    from twin.perf.profile import Profile, available_profiles, load_profile

    for name in available_profiles():
        prof = load_profile(name)
        Profile.from_dict(prof.to_dict(), name)


def test_byte_order_marks_and_merge_keys_are_read(tmp_path):
    """A UTF-8 byte-order mark (some editors write one) before a JSON Lines workload or a TOML scenario
    was refused as a parse error; a YAML merge key may override its anchor's keys (no repeated key)."""
    (tmp_path / "w.jsonl").write_bytes(b'\xef\xbb\xbf{"arrival_s": 0.1, "prompt_tokens": 10, "output_tokens": 5}\n')
    (tmp_path / "s.toml").write_bytes(b"\xef\xbb\xbfduration = 5\n")
    (tmp_path / "s.yaml").write_text("base: &b {rps: 1}\nx:\n  <<: *b\n  rps: 2\n")
    rc, out, err = run_cli(["run", "--no-progress", "--json", "--trace", str(tmp_path / "w.jsonl"), "--horizon", "5"])
    assert rc == 0 and json.loads(out)["requests_finished"] == 1, err
    rc, out, err = run_cli(["run", "--no-progress", "--json", "--config", str(tmp_path / "s.toml")])
    assert rc == 0 and json.loads(out)["scenario"]["duration"] == 5, err
    rc, _, err = run_cli(["run", "--no-progress", "--config", str(tmp_path / "s.yaml")])
    assert rc == 2 and "unknown option(s) base, x" in err, err


def test_a_real_row_pasted_twice_is_said_and_scored_per_row(files):
    """A row of a real-run table repeated cell for cell is named in a warning (it is re-created and scored once
    per row, as before: a table may repeat a run on purpose); the ids stay apart (``#0``, ``#1``)."""
    from twin.validation.specs import DuplicateRunWarning, load_real

    with pytest.warns(DuplicateRunWarning, match=r"row 2 \(line 3\) repeats row 1 \(line 2\) cell for cell"):
        df = load_real(files / "real_duprow.csv")
    assert len(df) == 2 and df["run_id"].is_unique
    # the copies are the same run, re-created the same (their seeds came from the ids with #0 / #1)
    from twin.validation.specs import spec_from_row

    a, b = (spec_from_row(r) for _, r in df.iterrows())
    assert a.seed == b.seed and a.run_id != b.run_id


def test_slora_prompts_beyond_its_default_batch_max_tokens_are_refused_up_front(tmp_path):
    """Without --gpu-mem-gb the pool is the profile's (the check skipped it and the run rejected every request):
    S-LoRA's default batch_max_tokens is checked as the engine sizes it. That default is max(pool / 6,
    max_req_total_len) (``api_server.py``): with --slora-max-total-len raised to 300000 the 150000-token prompts fit
    one prefill mini-batch and are served (a fixed 3072 floor refused them all)."""
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps({"arrival_s": i, "prompt_tokens": 150_000, "output_tokens": 10}) + "\n"
                            for i in range(5)))
    out_dir = tmp_path / "out"
    rc, out, err = run_cli(["run", "--no-progress", "--policy", "slora", "--trace", str(path),
                            "--slora-max-prompt-len", "200000", "--slora-max-total-len", "300000", "--out", str(out_dir)])
    assert rc == 0 and "Traceback" not in err, err
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["slora_batch_max_tokens"] == 300_000 and summary["requests_finished"] == 5


def test_a_dumped_s_lora_scenario_replays(tmp_path, capsys):
    """The scenario the twin writes for an S-LoRA run records the slots it resolved (vLLM's default); replaying
    it is not refused as a vLLM option given to S-LoRA, as the same key in a hand-written file is."""
    assert main(["run", "--policy", "chameleon", "--dump-config"]) == 0
    (tmp_path / "c.toml").write_text(capsys.readouterr().out)
    rc, out, err = run_cli(["run", "--no-progress", "--json", "--duration", "5", "--config", str(tmp_path / "c.toml")])
    assert rc == 0, err


def test_yaml_numbers_read_as_toml_reads_them(tmp_path):
    """YAML 1.2 numbers (PyYAML reads YAML 1.1: ``010`` as octal 8, ``1e0`` as text): a scenario in YAML runs as
    the same scenario in TOML does."""
    from twin.scenario import load_scenario_file

    (tmp_path / "s.yaml").write_text("duration: 5\nslots: 010\nrps: 1e0\nranks: [8, 0x10]\n")
    (tmp_path / "s.toml").write_text("duration = 5\nslots = 10\nrps = 1.0\nranks = [8, 16]\n")
    y, _ = load_scenario_file(tmp_path / "s.yaml")
    t, _ = load_scenario_file(tmp_path / "s.toml")
    assert y == t and y["slots"] == 10 and y["rps"] == 1.0


def test_a_burst_has_no_offered_rate(files):
    """Every request at t = 0 without a horizon: the offered rate is undefined (null; the console says so), not
    the requests over a 1 s stand-in, which read as a throughput above the offered load."""
    rc, out, err = run_cli(["run", "--no-progress", "--json", "--trace", str(files / "burst.csv")])
    s = json.loads(out)
    assert rc == 0 and s["offered_rps"] is None and s["requests_finished"] == 20
    rc, out, err = run_cli(["run", "--no-progress", "--trace", str(files / "burst.csv")])
    assert "all at t=0 / " in out


def test_a_recorded_trace_digest_without_a_trace_file_is_said_so(tmp_path):
    """A scenario that records a workload file's digest but replays a synthetic trace: not 'the workload file's
    content differs' (there is no file), but that the line is not read."""
    (tmp_path / "s.toml").write_text(f'duration = 5\ntrace_sha256 = "{"a" * 64}"\n')
    rc, out, err = run_cli(["run", "--no-progress", "--config", str(tmp_path / "s.toml")])
    assert rc == 0 and "records a workload file's content (trace_sha256) but replays no file" in err, err
    assert "differ" not in err


def test_a_vllm_run_s_summary_replays_on_an_s_lora_preset(tmp_path):
    """A summary the twin wrote holds every option of its run: replayed with --policy slora, its vLLM options are
    said in a warning (S-LoRA does not read them), not refused as a hand-written file's are."""
    rc, _, err = run_cli(["run", "--no-progress", "--duration", "5", "--cpu-slots", "8", "--slots", "4",
                          "--max-lora-rank", "64", "--out", str(tmp_path / "v")])
    assert rc == 0, err
    rc, out, err = run_cli(["run", "--no-progress", "--json", "--config", str(tmp_path / "v" / "summary.json"),
                            "--policy", "slora"])
    assert rc == 0, err
    assert "cpu_slots = 8, max_lora_rank = 64: options of another serving system than this run's" in err, err
