"""Task 3a, language modelling: the AWD-LSTM (Merity et al. 2017) on WikiText-2's token files, or on the synthetic
corpus the runner generates (NOT WikiText-2), trained with the public page's recipe (docs/tasks-language.md).

``corpus`` reads and writes the token files, ``model`` is the AWD-LSTM, ``rules`` the recipe's pure rules (BPTT
lengths, rates, the averaged-SGD switch, AR/TAR), ``loop`` one rank's training and ``task`` the kind under
``mlbench-runner train``.
"""
