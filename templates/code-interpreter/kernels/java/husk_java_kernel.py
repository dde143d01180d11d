"""husk's Java kernel: Jupyter's protocol (ipykernel) over a JShell bridge (HuskJShell, next to
this file), which runs each cell with the JDK's JShell API and sends back what it prints, the
value of its last expression, or its error (see HuskJShell.java for the bridge's protocol).

Cells share one JShell: variables, methods, classes and imports persist from cell to cell.
An interrupt (SIGINT, as Jupyter sends it) stops the running cell with JShell's own stop and
the kernel goes on. Per-call environment variables (E2B's `run_code(envs=...)`) work through
`System.getenv`: the bridge's JVM opens java.util to the cells so that husk can set them.
"""

import base64
import codecs
import os
import subprocess

from ipykernel.kernelbase import Kernel

HERE = os.path.dirname(os.path.abspath(__file__))
JAVA = "/usr/bin/java"


class JavaKernel(Kernel):
    implementation = "husk-java"
    implementation_version = "1.0"
    language = "java"
    banner = "Java (JShell), husk's kernel"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._bridge = subprocess.Popen(
            [
                JAVA,
                # Per-call environment variables are set through System.getenv's map.
                "--add-opens=java.base/java.util=ALL-UNNAMED",
                "--add-opens=java.base/java.lang=ALL-UNNAMED",
                # A small, quick-starting JVM: a cell's code is compiled once and run a few
                # times, not for hours.
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-cp",
                HERE,
                "HuskJShell",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
        )
        kind, fields = self._read()
        if kind != "ready":
            raise RuntimeError(f"the Java bridge did not start ({kind})")
        self._version = fields[0].decode()

    @property
    def language_version(self):
        return self._version

    @property
    def language_info(self):
        return {
            "name": "java",
            "version": self._version,
            "mimetype": "text/x-java-source",
            "file_extension": ".java",
            "codemirror_mode": "text/x-java",
        }

    def _read(self):
        line = self._bridge.stdout.readline()
        if not line:
            return "gone", []
        parts = line.split()
        return parts[0].decode(), [base64.b64decode(p) for p in parts[1:]]

    def _send(self, line):
        self._bridge.stdin.write(line.encode() + b"\n")
        self._bridge.stdin.flush()

    def do_execute(self, code, silent, store_history=True, user_expressions=None, allow_stdin=False):
        self._send("exec " + base64.b64encode(code.encode()).decode())
        decoders = {k: codecs.getincrementaldecoder("utf-8")("replace") for k in ("out", "err")}
        error = None
        interrupted = False
        while True:
            try:
                kind, fields = self._read()
            except KeyboardInterrupt:
                # Stop the cell; its end still comes as `done`.
                interrupted = True
                self._send("stop")
                continue
            if kind in ("out", "err"):
                text = decoders[kind].decode(fields[0])
                if text and not silent:
                    name = "stdout" if kind == "out" else "stderr"
                    self.send_response(self.iopub_socket, "stream", {"name": name, "text": text})
            elif kind == "value":
                if not silent:
                    self.send_response(
                        self.iopub_socket,
                        "execute_result",
                        {
                            "execution_count": self.execution_count,
                            "data": {"text/plain": fields[0].decode()},
                            "metadata": {},
                        },
                    )
            elif kind == "error":
                name, value, tb = (f.decode() for f in fields)
                error = {"ename": name, "evalue": value, "traceback": tb.split("\n")}
            elif kind == "done":
                break
            elif kind == "gone":
                error = {
                    "ename": "KernelDied",
                    "evalue": "the Java bridge exited",
                    "traceback": ["the Java bridge exited (System.exit, or it crashed)"],
                }
                break
        if interrupted and error is None:
            error = {
                "ename": "InterruptedException",
                "evalue": "the cell was interrupted",
                "traceback": ["java.lang.InterruptedException: the cell was interrupted"],
            }
        if error is not None:
            if not silent:
                self.send_response(self.iopub_socket, "error", error)
            return {"status": "error", "execution_count": self.execution_count, **error}
        return {
            "status": "ok",
            "execution_count": self.execution_count,
            "payload": [],
            "user_expressions": {},
        }

    def do_shutdown(self, restart):
        try:
            self._bridge.kill()
        except OSError:
            pass
        return {"status": "ok", "restart": restart}


if __name__ == "__main__":
    from ipykernel.kernelapp import IPKernelApp

    IPKernelApp.launch_instance(kernel_class=JavaKernel)
