"""Several runs in one child process (one TensorFlow start): the child prints `=== run NAME`
before each run's output; `fenced` splits what it printed back into runs."""


def fenced(text: str) -> dict:
  """{run name: its part of `text`} between the child's markers."""
  parts, name = {}, None
  for line in text.splitlines(keepends=True):
    if line.startswith("=== run "):
      name = line[len("=== run "):].strip()
      parts[name] = ""
    elif name is not None:
      parts[name] += line
  return parts
