"""Other libraries' dispatch rules as data plus predictors (AITER, FlyDSL, CK, SGLang).

Each module reads the library's own tables or conditions and answers which config a launch takes,
so an experiment can say in advance where a kernel's bits will follow the batch.
"""
