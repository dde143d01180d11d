"""Makes the simulated internet's TLS certificates (`python3 certs.py DIR`): a CA (DIR/ca.pem,
the file husk's proxy is told to trust with `--net-upstream-ca`) and the web server's
certificate for allowed.test and other.test signed by it (DIR/web.pem, DIR/web.key), with the
`openssl` command. Shared by the Python and JS compat suites."""

import subprocess
import sys
from pathlib import Path


def openssl(d: Path, *args: str) -> None:
    r = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60, cwd=d)
    if r.returncode != 0:
        sys.exit(f"openssl {' '.join(args)}: {r.stderr.strip()}")


def main() -> None:
    d = Path(sys.argv[1])
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    openssl(d, "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=husk netsim CA", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign")
    openssl(d, "req", *ec, "-keyout", "web.key", "-out", "web.csr", "-subj", "/CN=allowed.test")
    (d / "web.ext").write_text(
        "subjectAltName=DNS:allowed.test,DNS:other.test\nbasicConstraints=CA:FALSE\n"
        "extendedKeyUsage=serverAuth\n"
    )
    openssl(d, "x509", "-req", "-in", "web.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "web.pem", "-days", "2", "-extfile", "web.ext")


if __name__ == "__main__":
    main()
