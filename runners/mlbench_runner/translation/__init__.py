"""Task 4b's pieces (Transformer, WMT17 EN-DE) and the synthetic language pair its smoke tests train on.

:mod:`.corpus` makes and reads parallel text, :mod:`.transformer` is the model, :mod:`.decoding` greedy and beam
search, :mod:`.bleu` scores with sacrebleu, :mod:`.optim` the recipe's loss, schedule, accumulation and loss
scaling, :mod:`.loop` one rank's training to a BLEU goal.
"""
