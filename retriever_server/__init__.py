"""Dense Wikipedia retriever (E5/MiniLM + FAISS) and web-search proxy, Search-R1 wire compatible.

Ships alone in a container: imports nothing from the rest of the repository.
Entry points: ``python -m retriever_server.build_index`` and ``python -m retriever_server.serve``;
Python API: :func:`retriever_server.build_index.build_index`, :func:`retriever_server.app.create_app`,
:class:`retriever_server.background.RunningServer` (in a thread) and ``ServerProcess`` (a child).
"""

__version__ = "0.1.0"
