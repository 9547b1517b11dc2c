"""Client for the code sandbox (SandboxFusion `/run_code` schema)."""

from __future__ import annotations

from agent_env.tools.http import JsonHttp, ToolError

# Extra seconds the HTTP call waits beyond the sandbox's own run timeout.
HTTP_MARGIN_S = 5.0
# SandboxFusion's RunCodeResponse.status values (sandbox_fusion.RunStatus).
RUN_STATUSES = ("Success", "Failed", "SandboxError")


def format_run_result(data: dict) -> str:
    """stdout + stderr of a `/run_code` answer, with a note when the run did not finish or was
    killed (SandboxFusion reports a death by signal N as return code -N; a memory kill is -9)."""
    if not isinstance(data, dict):
        raise ToolError(f"sandbox answered {type(data).__name__}, expected an object")
    if data.get("status") not in RUN_STATUSES:
        raise ToolError(f"sandbox answer is not the /run_code schema: status {str(data.get('status'))[:40]!r} "
                        f"is not one of {RUN_STATUSES}")
    run = data.get("run_result") or {}
    compile_ = data.get("compile_result") or {}
    if not isinstance(run, dict) or not isinstance(compile_, dict):
        raise ToolError("sandbox answer is not the /run_code schema: run_result/compile_result is not an object")
    text = (compile_.get("stderr") or "") + (run.get("stdout") or "") + (run.get("stderr") or "")
    status, return_code = run.get("status"), run.get("return_code")
    if status and status != "Finished":
        text += f"\n[run status: {status}]"
    elif isinstance(return_code, int) and return_code < 0:
        text += f"\n[killed by signal {-return_code}]"
    if data.get("status") == "SandboxError":
        raise ToolError(f"sandbox error: {data.get('message') or 'unknown'}")
    return text


class SandboxClient:
    """`await run(code)` → the program's output text."""

    def __init__(self, url: str | None, http: JsonHttp, run_timeout_s: float = 10.0, language: str = "python",
                 http_margin_s: float = HTTP_MARGIN_S):
        self.url, self.http = url, http
        self.run_timeout_s, self.language, self.http_margin_s = run_timeout_s, language, http_margin_s

    async def run(self, code: str) -> str:
        if self.url is None:  # a run without a code tool: the code goes nowhere
            raise ToolError("no code sandbox in this run (sandbox_url: null)")
        payload = {"code": code, "language": self.language, "run_timeout": self.run_timeout_s}
        data = await self.http.post(self.url, payload, timeout_s=self.run_timeout_s + self.http_margin_s)
        return format_run_result(data)
