"""Tasks 4b's (Transformer, WMT17 EN-DE) and 4a's (GNMT, WMT16 EN-DE) pieces and the synthetic language pair their
smoke tests train on.

:mod:`.corpus` makes and reads parallel text, :mod:`.transformer` and :mod:`.gnmt` are the models,
:mod:`.decoding` greedy and beam search (with GNMT's length normalisation and coverage penalty), :mod:`.bleu`
scores with sacrebleu, :mod:`.optim` the recipes' loss, schedules, accumulation, clipping and loss scaling,
:mod:`.loop` one rank's training to a BLEU goal (one loop for both models).
"""
