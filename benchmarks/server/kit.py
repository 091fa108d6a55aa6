"""Fill a folder (default ``.kit/``, git-ignored) with what a SGLang 0.5.17 server needs on a GPU
machine whose image already has Python 3.12, torch 2.11.0, triton 3.6.0 and the common scientific
packages, but no network.

    python benchmarks/server/kit.py [--dest .kit]

The wheels are downloaded for CPython 3.12 on x86-64 Linux (into ``build/kit-wheels``), unpacked as
``pip install --target`` would for that interpreter, and packed into one ``site.tar.xz`` (a solid
archive: 60 % of the wheels' size). ``gpu_server.sh`` unpacks it into a folder on ``PYTHONPATH``.
What it holds:

| wheel | why |
|---|---|
| ``sglang==0.5.17`` without ``multimodal_gen/``, ``test/`` and the Rust gRPC / HTTP servers' libraries | the server (cp312); what is left out is the diffusion runtime, SGLang's own tests, and two servers taken only under ``--grpc-mode`` / ``SGLANG_RUST_SERVER`` |
| ``sglang-kernel==0.4.5`` without ``flash_ops`` (FA3), ``flashmla_ops``, ``infllm_ops`` and ``sm100/`` | SGLang's CUDA ops for torch 2.11 on sm90; the libraries left out are attention kernels the harness's servers do not select (they run ``--attention-backend triton``), and make up 1.1 GB of the 1.2 GB |
| ``xgrammar==0.2.1`` without ``lib/`` | imported by SGLang's function-call parsers; ``lib/`` is its static library for C++ builds |
| ``flashinfer-python==0.6.15.post1`` | SGLang 0.5.17 imports it on CUDA, and sglang-kernel 0.4.5's RMSNorms call its norm kernels, which its JIT compiles on first use with the machine's ``nvcc`` (into ``~/.cache/flashinfer``); NemotronH's attention layers run its attention kernels (SGLang 0.5.17 serves NemotronH with neither its triton nor its torch_native backend) |
| ``sgl-deep-gemm==0.1.5.post1`` without ``deep_gemm/include/`` | SGLang 0.5.17's speculative decoding imports it on CUDA (its draft worker lists the sparse-attention backend among those it captures graphs for, and that module imports ``deep_gemm``); ``include/`` holds the CUTLASS headers of its JIT, for kernels the harness's servers do not run |
| ``transformers==5.12.1``, ``tokenizers==0.22.2`` | SGLang 0.5.17's pin (a newer transformers registers configs SGLang 0.5.17 registers too) |
| the pure-Python packages in ``PACKAGES`` | what SGLang's server modules import that the image lacks |

``manifest.json`` beside the archive names each wheel and the archive's SHA-256; ``gpu_server.sh``
refuses a kit whose archive does not match it. The archive is refused above ``LIMIT`` (52 MiB), so
that it and the repository copy to the GPU machine together in under 64 MiB.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

SGLANG = "sglang==0.5.17"
SGLANG_KERNEL = "sglang-kernel==0.4.5"
XGRAMMAR = "xgrammar==0.2.1"
FLASHINFER = "flashinfer-python==0.6.15.post1"
DEEP_GEMM = "sgl-deep-gemm==0.1.5.post1"
PINNED = ["transformers==5.12.1", "tokenizers==0.22.2"]
# the image lacks these; each is imported by a module on SGLang 0.5.17's server path
PACKAGES = [
    "annotated-types==0.7.0", "apache-tvm-ffi==0.1.11", "compressed-tensors==0.13.0", "dill==0.4.0",
    "distro==1.9.0", "fastapi==0.121.0", "gguf==0.17.1", "interegular==0.3.3", "jiter==0.12.0",
    "msgspec==0.19.0", "openai==2.6.1", "opentelemetry-api==1.39.1", "orjson==3.11.4",
    "partial-json-parser==0.2.1.1.post6", "pybase64==1.4.2", "pydantic==2.12.4", "pydantic-core==2.41.5",
    "python-multipart==0.0.20", "pyzmq==27.1.0", "setproctitle==1.3.7", "sniffio==1.3.1",
    "starlette==0.49.3", "typing-inspection==0.4.2", "uvicorn==0.38.0", "loguru==0.7.3",
    # IPython (sglang/utils.py imports IPython.display) and what it imports
    "ipython==9.8.0", "ipython-pygments-lexers==1.1.1", "asttokens==3.0.1", "decorator==5.2.1",
    "executing==2.2.1", "jedi==0.19.2", "matplotlib-inline==0.2.1", "parso==0.8.5", "pexpect==4.9.0",
    "prompt-toolkit==3.0.52", "ptyprocess==0.7.0", "pure-eval==0.2.3", "stack-data==0.6.3",
    "traitlets==5.14.3", "wcwidth==0.2.14",
    "jsonschema==4.25.1", "jsonschema-specifications==2025.9.1", "referencing==0.37.0", "rpds-py==0.30.0",
    "soundfile==0.13.1", "cffi==2.0.0", "pycparser==2.23",
    # SGLang's benchmark client (sglang.bench_serving) imports datasets
    "datasets==4.4.1", "multiprocess==0.70.18",
]
# wheel name prefix -> member prefixes left out (see the table above)
STRIP = {
    "sglang-": ("sglang/multimodal_gen/", "sglang/test/", "sglang/srt/server/_core", "sglang/srt/grpc/_core"),
    "sglang_kernel-": ("sgl_kernel/flash_ops", "sgl_kernel/flashmla_ops", "sgl_kernel/infllm_ops", "sgl_kernel/sm100/"),
    "xgrammar-": ("xgrammar/lib/",),
    "flashinfer_python-": (),
    "sgl_deep_gemm-": ("deep_gemm/include/",),
}
LIMIT = 52 * 2**20
PLATFORMS = ["manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_27_x86_64", "manylinux_2_28_x86_64",
             "manylinux_2_31_x86_64", "manylinux_2_34_x86_64"]


def download(specs: list[str], dest: pathlib.Path) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", "--dest", str(dest)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + specs, check=True)


def strip_wheel(src: pathlib.Path, dest_dir: pathlib.Path, strip: tuple[str, ...]) -> pathlib.Path:
    """A copy of wheel ``src`` in ``dest_dir`` without the members under ``strip``, its RECORD rewritten to match."""
    out = dest_dir / src.name
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
        record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        rows = []
        for info in zin.infolist():
            if info.filename == record_name or info.filename.startswith(strip):
                continue
            data = zin.read(info)
            zout.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{info.filename},sha256={digest},{len(data)}")
        rows.append(f"{record_name},,")
        zout.writestr(record_name, "\n".join(rows) + "\n")
    return out


def sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--dest", type=pathlib.Path, default=pathlib.Path(".kit"), help="folder to fill (emptied first)")
    ap.add_argument("--wheels", type=pathlib.Path, default=pathlib.Path("build/kit-wheels"),
                    help="where the downloaded wheels are kept (emptied first)")
    args = ap.parse_args(argv)
    for folder in (args.dest, args.wheels):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    download([*PINNED, *PACKAGES], args.wheels)
    with tempfile.TemporaryDirectory() as tmp:
        download([SGLANG, SGLANG_KERNEL, XGRAMMAR, FLASHINFER, DEEP_GEMM], pathlib.Path(tmp))
        for wheel in sorted(pathlib.Path(tmp).glob("*.whl")):
            strip_wheel(wheel, args.wheels, next(v for k, v in STRIP.items() if wheel.name.startswith(k)))
    wheels = sorted(args.wheels.glob("*.whl"))
    with tempfile.TemporaryDirectory() as site:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
               "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--target", site]
        for p in PLATFORMS:
            cmd += ["--platform", p]
        subprocess.run(cmd + [str(w) for w in wheels], check=True)
        archive = args.dest / "site.tar.xz"
        subprocess.run(["tar", "-C", site, "-cf", str(archive.with_suffix("")), "."], check=True)
        subprocess.run(["xz", "-T0", "-6", str(archive.with_suffix(""))], check=True)
    size = archive.stat().st_size
    if size > LIMIT:
        raise SystemExit(f"--dest: the kit is {size / 2**20:.1f} MiB, over the {LIMIT / 2**20:.0f} MiB allowed for it")
    manifest = dict(sglang=SGLANG, sglang_kernel=SGLANG_KERNEL, stripped=STRIP, wheels=[w.name for w in wheels],
                    archive=archive.name, sha256=sha256(archive))
    (args.dest / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"{args.dest}: {len(wheels)} wheels in {archive.name}, {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
