"""Run an Argo CD health script with a real Lua interpreter, the way Argo CD calls it.

Argo CD sets the global ``obj`` to the live object (maps become tables, lists 1-based tables, JSON
``null`` nil), runs the script and reads ``hs.status`` / ``hs.message`` from the table it returns.
Here the object becomes a Lua table literal, the script is loaded with ``loadfile`` into an
environment holding ``obj`` and the standard functions Argo CD's gopher-lua VM offers (reading any
other global is an error, so a typo cannot pass as ``nil``), and the result comes back on stdout.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: the interpreter CI installs (`make system-deps`); Argo CD's gopher-lua is Lua 5.1, also checked when present
LUA = "lua5.4"
LUA51 = "lua5.1"

_DRIVER = """
local env = {
  obj = %(obj)s,
  assert = assert, error = error, ipairs = ipairs, next = next, pairs = pairs, pcall = pcall, select = select,
  tonumber = tonumber, tostring = tostring, type = type, unpack = unpack,
  math = math, string = string, table = table,
}
setmetatable(env, {__index = function(_, name)
  error("health script read the undefined global '" .. tostring(name) .. "'", 2)
end})
local chunk, err
if setfenv then  -- Lua 5.1
  chunk, err = loadfile(%(script)s)
  if chunk then setfenv(chunk, env) end
else
  chunk, err = loadfile(%(script)s, "t", env)
end
if not chunk then
  io.stderr:write(tostring(err))
  os.exit(2)
end
local hs = chunk()
if type(hs) ~= "table" then
  io.stderr:write("the health script returned " .. type(hs) .. ", not a table")
  os.exit(3)
end
io.write(tostring(hs.status), "\\0")
if hs.message ~= nil then io.write("+", tostring(hs.message)) end
"""


@dataclass(frozen=True)
class Health:
    status: str
    message: str | None


def lua_string(text: str) -> str:
    """A Lua 5.1/5.4 string literal: printable ASCII as is, every other byte as a decimal escape."""
    out = []
    for byte in text.encode():
        ch = chr(byte)
        if 32 <= byte < 127 and ch not in '"\\':
            out.append(ch)
        else:
            out.append(f"\\{byte:03d}")
    return '"' + "".join(out) + '"'


def lua_literal(value: Any) -> str:
    """A JSON-like value (as ``yaml.safe_load`` or the API returns it) as a Lua constructor."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} has no JSON form")
        return repr(value)
    if isinstance(value, str):
        return lua_string(value)
    if isinstance(value, list | tuple):
        return "{" + ", ".join(lua_literal(v) for v in value) + "}"
    if isinstance(value, dict):
        # a null member is simply absent, as in Argo CD's conversion
        return (
            "{"
            + ", ".join(f"[{lua_string(str(k))}] = {lua_literal(v)}" for k, v in value.items() if v is not None)
            + "}"
        )
    raise TypeError(f"cannot express {type(value).__name__} in Lua")


def interpreter(name: str = LUA) -> str | None:
    return shutil.which(name)


def run_health(script: Path, obj: dict[str, Any], lua: str = LUA) -> Health:
    """``hs.status`` and ``hs.message`` of ``script`` for ``obj``; raises on a Lua error (Argo CD: Unknown)."""
    program = _DRIVER % {"obj": lua_literal(obj), "script": lua_string(str(script))}
    res = subprocess.run([lua, "-"], input=program.encode(), capture_output=True, timeout=30, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"{lua} {script}: exit {res.returncode}: {res.stderr.decode(errors='replace')}")
    status, _, message = res.stdout.decode().partition("\0")
    return Health(status, message[1:] if message.startswith("+") else None)
