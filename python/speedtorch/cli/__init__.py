"""speedtorch.cli: what ``python -m speedtorch`` runs (speedtorch/__main__.py): ``info`` (info.py), the demos
(train_demo.py, transfer_demo.py; ``engram-demo`` is speedtorch.models.engram_gpt's ``main``), and the timing and
table helpers they share with bench/ (benchmarking.py)."""
