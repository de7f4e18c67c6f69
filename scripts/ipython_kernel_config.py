# Kernel settings for this book's .venv (make copies this file to .venv/etc/ipython/).
# The build and the tests start each kernel on 127.0.0.1 and talk to it through the kernel
# manager alone; ipykernel warns on every start that this local TCP traffic is unencrypted.
# Known and harmless here, so exactly that message is dropped, and every other one is kept.
import logging

logging.getLogger("IPKernelApp").addFilter(
    lambda record: "running over TCP without encryption" not in record.getMessage()
)
