"""The reader's Python: one fresh interpreter per document that runs its blocks in order (tests/docs/test_examples.py).

Started as ``python -c <this file's text> CMD_FD REPLY_FD`` with its working directory in a temporary folder, so it
sees what a user who pasted the blocks into ``python`` there sees: no conftest, no fixture, the installed fakeviz.
It reads one JSON request per line from CMD_FD (``{"lang": "python" | "ipython", "source", "path", "line"}``),
runs the source in the document's one namespace (``ipython`` through an IPython shell on that namespace, for
magics) and writes one JSON reply per line to REPLY_FD: ``{"error": null}`` or the traceback's text. What the
blocks print goes to this process's stdout and stderr (the test keeps them in a log file).
"""

import json
import os
import sys
import traceback

namespace = {"__name__": "__main__", "__builtins__": __builtins__}
shell = None
commands = os.fdopen(int(sys.argv[1]), "r")
replies = os.fdopen(int(sys.argv[2]), "w")
for request in commands:
    request = json.loads(request)
    error = None
    if request["lang"] == "python":
        # the block's lines keep their line numbers in the document, so a traceback names the document's line
        source = "\n" * (request["line"] - 1) + request["source"]
        try:
            exec(compile(source, request["path"], "exec"), namespace)
        except Exception:  # noqa: BLE001 (any error of the block is its reply)
            error = traceback.format_exc()
    else:
        if shell is None:
            from IPython.core.interactiveshell import InteractiveShell

            shell = InteractiveShell.instance(user_ns=namespace)
        result = shell.run_cell(request["source"])
        if not result.success:
            failure = result.error_before_exec or result.error_in_exec
            error = "".join(traceback.format_exception(failure)) if failure else "the cell failed"
    sys.stdout.flush()
    sys.stderr.flush()
    replies.write(json.dumps({"error": error}) + "\n")
    replies.flush()
