# Imports a module that does not exist: the function's init fails with
# Runtime.ImportModuleError.
import no_such_module_here  # noqa: F401


def handler(event, context):
    return "never"
