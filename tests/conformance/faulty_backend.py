"""A torch.compile backend that kills its process on ``abs`` (abort: the worker dies) and never
returns on ``neg`` (a hang); every other graph runs as Dynamo captured it. The conformance sweep
must record a crash and a hang and go on."""

import os
import time

import torch


def _targets(gm):
    return {node.target for node in gm.graph.nodes if node.op == "call_function"}


def backend(gm, example_inputs):
    found = _targets(gm)
    if torch.abs in found:
        def crash(*args):
            os.abort()
        return crash
    if torch.neg in found:
        def hang(*args):
            time.sleep(3600)
        return hang
    return gm.forward
