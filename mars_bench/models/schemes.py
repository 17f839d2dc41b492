"""Names of the draft quantization schemes: the config's value -> what records and run specs call what runs.

int8 runs per-row activation scales (``fastpath.Int8Linear``), recorded as int8row (tag "draftint8" marks older
per-call-scale runs); q8 / q4: 8- / 4-bit codes with an fp16 scale per 32 weights (``quant.py``).
"""

DRAFT_QUANT_SCHEME = {"none": "none", "int8": "int8row", "q8": "q8g32", "q4": "q4g32"}
