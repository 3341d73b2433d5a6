"""The application layer: the ``selfrag`` command line and the quickstart.

It may call every stage (data_gen, training, inference); the core contract in ``selfrag/`` never imports it.
"""
