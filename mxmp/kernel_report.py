"""Old path: the kernel report moved to :mod:`mxmp.policy.kernel_report`."""
from .policy.kernel_report import (FORMAT, VERDICTS, VERSION, KernelReport,  # noqa: F401
                                 load_kernel_report, machine_info)

__all__ = ['KernelReport', 'load_kernel_report', 'machine_info', 'FORMAT', 'VERDICTS']
