#!/usr/bin/env bash
# Fills the git-ignored .whl/ with what tests/gpu_sglang.sh installs on a GPU machine without network access
# (Python 3.12): sglang 0.5.23 and the packages its modules import that such an image lacks, at the versions
# `make test` installs. Run it from the repository root on a machine with network access, then copy .whl over.
#
# SGLang 0.5.23 is published as a cp311 manylinux wheel only; its modules are pure Python apart from the
# Rust radix TreeCore, which gpu_sglang.sh replaces with SGLang's Python one, so the wheel is renamed
# py3-none-any for Python 3.12.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
mkdir -p .whl
PKGS=(annotated_types==0.8.0 apache_tvm_ffi==0.1.15.post2 asttokens==3.0.2 cffi==2.1.1 compressed_tensors==0.20.1
      dill==0.4.1 executing==2.3.0 fastapi==0.165.0 gguf==0.19.0 httpcore2==2.16.2 httpx2==2.16.2 ipython==9.18.1
      ipython_pygments_lexers==1.1.1 jedi==0.20.1 jiter==0.19.0 loguru==0.7.3 matplotlib_inline==0.2.2
      msgspec==0.23.0 openai==3.57.0 opentelemetry_api==1.45.2 orjson==3.13.0 parso==0.8.7
      partial_json_parser==0.2.1.1.post7 pexpect==4.9.0 prompt_toolkit==3.0.53 ptyprocess==0.7.0 pure_eval==0.2.4
      pybase64==1.5.1 pycparser==3.12 pydantic==2.14.4 pydantic_core==2.50.5 python_multipart==0.0.34
      pyzmq==27.3.0 sniffio==1.3.1 soundfile==0.14.0 stack_data==0.6.3 starlette==1.10.0 traitlets==5.16.1
      truststore==0.10.5 typing_inspection==0.4.5 uvicorn==0.54.0 wcwidth==0.9.4 xgrammar==0.2.9)
"$PY" -m pip download -q --no-deps --dest .whl --python-version 3.12 --only-binary=:all: \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 "${PKGS[@]}"
tmp=$(mktemp -d)
"$PY" -m pip download -q --no-deps --dest "$tmp" --python-version 3.11 --only-binary=:all: \
    --platform manylinux_2_34_x86_64 sglang==0.5.23
mv "$tmp"/sglang-0.5.23-*.whl .whl/sglang-0.5.23-py3-none-any.whl
rmdir "$tmp"
du -sh .whl
