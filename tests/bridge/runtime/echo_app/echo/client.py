"""The process that answers: its pid, its parent's, and the signal it gets when that parent dies."""

import ctypes
import os

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()
PR_GET_PDEATHSIG = 2


@app.query()
def query(msg: Message, context: Context) -> Message:
    death = ctypes.c_int(0)
    ctypes.CDLL(None).prctl(PR_GET_PDEATHSIG, ctypes.byref(death))
    who = {"pid": os.getpid(), "parent": os.getppid(), "on_parent_death": death.value}
    return Message(RecordDict({"who": ConfigRecord(who)}), reply_to=msg)
