# make demo  — build .venv, compile a small PEFT-LoRA Llama and run it
# make test  — build .venv, run pytest and lit (CI calls exactly this)
PY := .venv/bin/python
STAMP := .venv/.stageml-installed

.PHONY: demo test sweep bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	$(PY) -m pytest -q
	PATH=$(CURDIR)/.venv/bin:$$PATH .venv/bin/lit -v lit_tests

sweep: $(STAMP)
	rm -f out/sweep.jsonl && mkdir -p out
	STAGEML_SWEEP_LOG=out/sweep.jsonl $(PY) -m pytest -q -m 'sweep or not sweep' tests/test_architectures.py; \
	  status=$$?; $(PY) tests/sweep_report.py out/sweep.jsonl > out/sweep.md; echo "the table: out/sweep.md"; exit $$status

bench: $(STAMP)
	$(PY) benchmarks/bench_cpu.py
	$(PY) benchmarks/bench_quantized.py

clean:
	rm -rf out build lit_tests/**/Output
