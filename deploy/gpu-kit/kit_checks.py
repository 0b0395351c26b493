"""The checks a GPU run kit part records: each a name, whether it passed and
a detail, printed as it happens and written into the part's JSON (report.py
reads them from there). Standard library only."""

checks = []


def check(name, ok, detail=""):
    checks.append({"name": name, "ok": bool(ok), "detail": str(detail)})
    print("%-5s %s %s" % ("ok" if ok else "FAIL", name, detail), flush=True)
    return ok


def all_passed():
    return all(c["ok"] for c in checks)
