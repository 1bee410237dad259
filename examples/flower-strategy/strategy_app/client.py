"""The ClientApp: your own ``ClientApp``, with fedblend's client half (``client_handler``) as its train, evaluate
and query handlers; here each handler also counts the messages its process answered (your own code around it)."""

from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedblend.flower import client_handler

CONFIG = Path(__file__).parent / "fedblend.toml"  # the server's config (the FAB ships *.toml files)

app = ClientApp()
fedblend_client = client_handler(CONFIG)  # answers fedblend's job batches (and its greeting) for this node
answered = {"train": 0, "evaluate": 0, "query": 0}


@app.train()
def train(msg: Message, context: Context) -> Message:
    answered["train"] += 1
    return fedblend_client(msg, context)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    answered["evaluate"] += 1
    return fedblend_client(msg, context)


@app.query()
def query(msg: Message, context: Context) -> Message:  # fedblend's greeting: the node's clients and data digests
    answered["query"] += 1
    return fedblend_client(msg, context)
