# A Python function run by AWS's own runtime client (awslambdaric, from PyPI,
# in the zip beside it; started by the zip's bootstrap) in the serve-linux
# nested scenario.
import os
import sys


class Failure(Exception):
    pass


def fn(event, context):
    if isinstance(event, dict) and event.get("fail"):
        raise Failure("asked to fail in " + context.aws_request_id)
    print("ric-log", context.aws_request_id)
    return {
        "client": "awslambdaric",
        "echo": event,
        "function_name": context.function_name,
        "remaining_ms_positive": context.get_remaining_time_in_millis() > 0,
        "greeting": os.environ.get("GREETING"),
        # What ran the handler: awslambdaric, not spore's bootstrap.
        "ric_loaded": "awslambdaric.bootstrap" in sys.modules,
    }
