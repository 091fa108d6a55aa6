# replayssm: `make demo` and `make test` create or reuse .venv and install what they need.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.replayssm-installed
# sglang 0.5.23 without its GPU-only requirements, plus the pure-Python packages its modules import
SGLANG := sglang==0.5.23
SGLANG_DEPS := transformers==5.19.0 msgspec orjson pybase64 psutil requests pydantic pyzmq einops fastapi uvicorn \
	aiohttp pillow tqdm regex IPython dill apache-tvm-ffi sentencepiece compressed-tensors gguf openai \
	partial_json_parser uvloop jsonschema xgrammar soundfile python-multipart

# sglang 0.5.17 (torch 2.11's release) unpacked beside it, with its transformers pin: its Python
# modules import on this torch, and tests/test_sglang_0517.py runs the adapter's seams against them
SGLANG_0517 := build/sglang-0.5.17
SGLANG_0517_PKGS := sglang==0.5.17 transformers==5.12.1 tokenizers==0.22.2 huggingface-hub==1.33.0 \
	httpx==0.28.1 httpcore==1.0.9 h11==0.16.0 anyio==4.11.0 sniffio==1.3.1

.PHONY: demo test test-wheel conformance clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -e ".[test,demo]"
	$(PY) -m pip install -q --no-deps $(SGLANG)
	$(PY) -m pip install -q $(SGLANG_DEPS)
	touch $(STAMP)

$(SGLANG_0517)/.installed: Makefile | $(STAMP)
	rm -rf $(SGLANG_0517)
	$(PY) -m pip install -q --no-deps --only-binary=:all: --target $(SGLANG_0517) --python-version 3.12 \
		--implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_17_x86_64 $(SGLANG_0517_PKGS)
	touch $@

demo: $(STAMP)
	$(PY) -m replayssm.demo

test: $(STAMP) $(SGLANG_0517)/.installed
	$(PY) -m pytest -q -n auto --ignore=tests/conformance
	$(MAKE) conformance
	$(MAKE) test-wheel

# The cross-framework conformance suite alone (also part of `make test`); prints its matrix.
conformance: $(STAMP)
	$(PY) -m pytest -q tests/conformance

# The same package from a built wheel, imported from outside the source tree.
test-wheel: $(STAMP)
	rm -rf build/wheel build/site && mkdir -p build/wheel build/site
	$(PY) -m pip wheel -q --no-deps --no-build-isolation -w build/wheel .
	$(PY) -m pip install -q --no-deps --target build/site build/wheel/replayssm-*.whl
	cd build && PYTHONPATH=$(CURDIR)/build/site:$(CURDIR)/tests $(CURDIR)/$(PY) -m pytest -q -p no:cacheprovider \
		--rootdir=$(CURDIR)/build $(CURDIR)/tests/test_wheel.py

clean:
	rm -rf build dist *.egg-info .pytest_cache
