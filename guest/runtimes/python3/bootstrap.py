"""spore's Python runtime for Linux function guests (run by spore-agent).

Standard library only. It starts before any function exists (the runtime's
*pre-init*): the interpreter and these imports are loaded, then it asks the
agent which function to run (`GET /2018-06-01/runtime/spore/function`, which
blocks until the host sends Configure) -- so a snapshot taken while it waits
holds an initialised interpreter every Python function can start from.

Then it does what Lambda's Python runtime does: sets the environment, puts
the code directory first on sys.path, imports `module.function` from the
handler, and loops on the Lambda Runtime API: `/invocation/next` ->
handler(event, context) -> `/response` or `/error`. Import failures go to
`/runtime/init/error` with Lambda's error types.

A function whose code directory holds an executable `bootstrap` (a zip that
brings its own runtime client, such as AWS's `awslambdaric`) has that
bootstrap run in this process's place once the function is known.
"""

import http.client
import importlib
import json
import os
import sys
import time
import traceback

API_PREFIX = "/2018-06-01/runtime"


class RuntimeClient:
    """A keep-alive HTTP connection to the agent's Runtime API."""

    def __init__(self, address):
        host, _, port = address.rpartition(":")
        self.host, self.port = host, int(port)
        self.conn = None

    def request(self, method, path, body=None, headers=None):
        # One retry on a fresh connection: the agent may have closed an idle one.
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port)
            try:
                self.conn.request(method, API_PREFIX + path, body=body, headers=headers or {})
                resp = self.conn.getresponse()
                data = resp.read()
                return resp.status, resp.headers, data
            except (ConnectionError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise

    def post_json(self, path, obj, headers=None):
        body = json.dumps(obj).encode()
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        return self.request("POST", path, body, h)


def error_shape(exc, tb=None):
    """Lambda's error JSON for an exception."""
    frames = traceback.extract_tb(tb if tb is not None else exc.__traceback__)
    return {
        "errorMessage": str(exc),
        "errorType": type(exc).__name__,
        "stackTrace": traceback.format_list(frames),
    }


def log_error(err):
    """Lambda prints a failed invocation to the log as `[ERROR] Type: message`."""
    print("[ERROR] %s: %s" % (err["errorType"], err["errorMessage"]), file=sys.stderr)
    for line in err.get("stackTrace", []):
        print(line, end="", file=sys.stderr)


class LambdaContext:
    """The `context` argument of a handler, with Lambda's attributes."""

    def __init__(self, request_id, deadline_ms, arn):
        env = os.environ
        self.aws_request_id = request_id
        self.invoked_function_arn = arn
        self.function_name = env.get("AWS_LAMBDA_FUNCTION_NAME", "")
        self.function_version = env.get("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        self.memory_limit_in_mb = env.get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "")
        self.log_group_name = env.get("AWS_LAMBDA_LOG_GROUP_NAME", "")
        self.log_stream_name = env.get("AWS_LAMBDA_LOG_STREAM_NAME", "")
        self.identity = None
        self.client_context = None
        self._deadline_ms = deadline_ms

    def get_remaining_time_in_millis(self):
        return max(self._deadline_ms - int(time.time() * 1000), 0)


class InitError(Exception):
    def __init__(self, error_type, message, tb=None):
        super().__init__(message)
        self.error_type = error_type
        self.tb = tb


def load_handler(handler, code_dir):
    """Imports `module.function` like Lambda (a module may be `dir/module`)."""
    try:
        module_name, function_name = handler.rsplit(".", 1)
    except ValueError:
        raise InitError(
            "Runtime.MalformedHandlerName",
            "Bad handler '%s': not enough values to unpack (expected 2, got 1)" % handler,
        )
    module_name = module_name.replace("/", ".")
    if code_dir not in sys.path:
        sys.path.insert(0, code_dir)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise InitError(
            "Runtime.ImportModuleError",
            "Unable to import module '%s': %s" % (module_name, e),
            e.__traceback__,
        )
    except SyntaxError as e:
        raise InitError(
            "Runtime.UserCodeSyntaxError",
            "Syntax error in module '%s': %s" % (module_name, e),
            e.__traceback__,
        )
    except Exception as e:
        raise InitError(type(e).__name__, str(e), e.__traceback__)
    fn = getattr(module, function_name, None)
    if fn is None:
        raise InitError(
            "Runtime.HandlerNotFound",
            "Handler '%s' missing on module '%s'" % (function_name, module_name),
        )
    if not callable(fn):
        raise InitError(
            "Runtime.HandlerNotFound",
            "Handler '%s' on module '%s' is not callable" % (function_name, module_name),
        )
    return fn


def post_init_error(client, err):
    log_error(err)
    client.post_json(
        "/init/error", err, {"Lambda-Runtime-Function-Error-Type": err["errorType"]}
    )


def run_invocation(client, fn, status_headers, event_bytes):
    request_id = status_headers.get("Lambda-Runtime-Aws-Request-Id", "")
    deadline = int(status_headers.get("Lambda-Runtime-Deadline-Ms", "0") or 0)
    arn = status_headers.get("Lambda-Runtime-Invoked-Function-Arn", "")
    trace = status_headers.get("Lambda-Runtime-Trace-Id")
    if trace:
        os.environ["_X_AMZN_TRACE_ID"] = trace
    else:
        os.environ.pop("_X_AMZN_TRACE_ID", None)
    context = LambdaContext(request_id, deadline, arn)
    try:
        event = json.loads(event_bytes) if event_bytes else {}
    except ValueError as e:
        err = {
            "errorMessage": "Unable to unmarshal input: %s" % e,
            "errorType": "Runtime.UnmarshalError",
            "stackTrace": [],
        }
        log_error(err)
        return post_error(client, request_id, err)
    try:
        result = fn(event, context)
    except Exception as e:
        err = error_shape(e)
        log_error(err)
        return post_error(client, request_id, err)
    try:
        body = json.dumps(result).encode()
    except (TypeError, ValueError) as e:
        err = {
            "errorMessage": "Unable to marshal response: %s" % e,
            "errorType": "Runtime.MarshalError",
            "stackTrace": [],
        }
        log_error(err)
        return post_error(client, request_id, err)
    client.request(
        "POST",
        "/invocation/%s/response" % request_id,
        body,
        {"Content-Type": "application/json"},
    )


def post_error(client, request_id, err):
    client.post_json(
        "/invocation/%s/error" % request_id,
        err,
        {"Lambda-Runtime-Function-Error-Type": err["errorType"]},
    )


def main():
    client = RuntimeClient(os.environ.get("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9001"))
    # Pre-init ends here: this blocks until the host configures the guest.
    status, _, body = client.request("GET", "/spore/function")
    if status != 200:
        print("bootstrap: /spore/function answered %d: %r" % (status, body[:200]), file=sys.stderr)
        return 1
    function = json.loads(body)
    os.environ.update({str(k): str(v) for k, v in (function.get("env") or {}).items()})
    code_dir = function.get("code_dir") or "/var/task"
    try:
        os.chdir(code_dir)
    except OSError as e:
        print("bootstrap: cannot enter %s: %s" % (code_dir, e), file=sys.stderr)
    custom = os.path.join(code_dir, "bootstrap")
    if os.path.isfile(custom) and os.access(custom, os.X_OK):
        # A zip that brings its own runtime client (AWS's awslambdaric, say)
        # runs its bootstrap in this process's place, as a provided runtime
        # would, with the function's environment.
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.execv(custom, [custom])
        except OSError as e:
            post_init_error(client, {
                "errorMessage": "cannot run %s: %s" % (custom, e),
                "errorType": "Runtime.InvalidEntrypoint",
                "stackTrace": [],
            })
            return 1
    try:
        fn = load_handler(os.environ.get("_HANDLER") or function.get("handler", ""), code_dir)
    except InitError as e:
        err = {
            "errorMessage": str(e),
            "errorType": e.error_type,
            "stackTrace": traceback.format_list(traceback.extract_tb(e.tb)) if e.tb else [],
        }
        post_init_error(client, err)
        return 1
    while True:
        status, headers, event = client.request("GET", "/invocation/next")
        if status != 200:
            print("bootstrap: /invocation/next answered %d: %r" % (status, event[:200]), file=sys.stderr)
            return 1
        run_invocation(client, fn, headers, event)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ConnectionError, http.client.HTTPException) as e:
        # The agent is gone: nothing left to serve.
        print("bootstrap: runtime API: %s" % e, file=sys.stderr)
        sys.exit(1)
