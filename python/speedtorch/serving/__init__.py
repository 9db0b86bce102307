"""speedtorch.serving: tables as inference reads them: rows in bf16, int8 or fp8, dequantized inside the gather
(quantized.py; rank_preserving_rounding.py: int8 codes that keep each row's ranking of the items), and the Engram
n-gram lookup over such rows (ngram_lookup.py); docs/engram.md. It builds on the ops and files only: an
NgramHashEmbedding (speedtorch.nn) makes its serving copy here."""

from .ngram_lookup import GraphedLookup, NgramHashLookup
from .quantized import FORMATS, QuantizedRows, format_row_bytes, gather_dequant, quantize_rows
from .rank_preserving_rounding import rank_preserving_codes

__all__ = ["FORMATS", "GraphedLookup", "NgramHashLookup", "QuantizedRows", "format_row_bytes", "gather_dequant",
           "quantize_rows", "rank_preserving_codes"]
