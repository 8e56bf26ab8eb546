"""The result of ``mxmp check-kernels`` (:class:`KernelReport`: rows, machine, JSON file) and
the policy changes it justifies (read by :meth:`mxmp.Policy.from_kernel_report`): an op with a
``wrong``, ``crash(...)`` or ``error`` case goes to float32; a float32 op ``ok`` in every case on
real kernels may compute in the target dtype (emulated evidence widens nothing).
"""
import collections
import dataclasses
import datetime
import json
import platform
from typing import Dict, List

from ..cpu_tier import MEANING, describe
from ..files import write_atomic

#: The ``format`` field of a report file, and its version.
FORMAT = 'mxmp-kernel-report'
VERSION = 1
#: Verdicts (``crash`` is written ``crash(SIGNAME)``).
VERDICTS = ('ok', 'wrong', 'crash', 'error', 'not-tested')
_BAD = ('wrong', 'crash', 'error')
_ROW_KEYS = ('op', 'class', 'variant', 'case', 'mode', 'fwd_err', 'bwd_err', 'verdict', 'detail')


def _cpu():
    """(model name with family and model numbers, flags) of the first CPU in /proc/cpuinfo."""
    info = {}
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                key, _, value = line.partition(':')
                if not key.strip() and info:
                    break  # end of the first processor's block
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    model = info.get('model name') or platform.processor() or platform.machine()
    if 'cpu family' in info and 'model' in info:
        model += ' (family %s, model %s)' % (info['cpu family'], info['model'])
    return model, info.get('flags', '').split()


def machine_info(target_dtype='bfloat16'):
    """dict: ``cpu``, bfloat16-relevant ``flags``, ``mxnet_version``, ``real_kernels``
    (:func:`mxmp.lp_kernels_available`), ``dnnl_max_cpu_isa`` and ``date``."""
    import os
    import mxnet as mx
    from ..device import lp_kernels_available
    model, flags = _cpu()
    wanted = ('avx2', 'avx512f', 'avx512_bf16', 'amx_bf16', 'amx_tile', 'avx512_fp16')
    return {'cpu': model, 'flags': [f for f in wanted if f in flags],
            'mxnet_version': mx.__version__,
            'real_kernels': bool(lp_kernels_available(target_dtype)),
            'dnnl_max_cpu_isa': os.environ.get('DNNL_MAX_CPU_ISA'),
            'date': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}


def _fmt_err(e):
    return '-' if e is None else ('inf' if e == float('inf') else '%.4f' % e)


@dataclasses.dataclass
class KernelReport:
    """Rows of the conformance suite and the machine they were measured on.

    Attributes:
        target_dtype (str): ``'bfloat16'`` or ``'float16'``.
        machine (dict): :func:`machine_info` of the machine that ran the suite, with
            ``mxmp._src.cpu_tier.tier_info``'s ``tier``, ``dnnl_max_cpu_isa`` (the cap oneDNN
            obeyed) and ``bf16_gemm_speed`` (reports of ``check_kernels``).
        rows (list of dict): keys ``op, class, variant, case, mode, fwd_err, bwd_err, verdict,
            detail`` (relative errors, None when not run).
        tolerances (dict): ``{'forward': float, 'backward': float}`` used for the verdicts.
        aliases (dict): alias -> canonical op, so a verdict covers every name of the op.
    """
    target_dtype: str
    machine: Dict
    rows: List[Dict]
    tolerances: Dict
    aliases: Dict = dataclasses.field(default_factory=dict)

    def verdicts(self, rows=None):
        """dict: op -> worst verdict over its cases (bad > ok > not-tested), over ``rows``
        (default: every row)."""
        out = {}
        for r in self.rows if rows is None else rows:
            old = out.get(r['op'])
            if old is None or _rank(r['verdict']) > _rank(old):
                out[r['op']] = r['verdict']
        return out

    def policy_changes(self, keep32):
        """``(lp_ops, fp32_ops)``: op names (aliases included) the evidence moves: an op with
        any case wrong, crashed or failed to ``fp32_ops``; an op of ``keep32`` (frozenset: the
        ops a policy keeps float32) with every case ``ok`` on real kernels, outside the
        lp-params case, to ``lp_ops``."""
        names_of = {}
        for alias, canon in self.aliases.items():
            names_of.setdefault(canon, {canon}).add(alias)
        lp, fp32 = set(), set()
        # An op run only in the lp-params case (a float32 op fed low-precision parameters)
        # was not run in low precision: that is no evidence for widening it.
        # Nor is the library case (mxmp's float32 kernel against MXNet's float32 kernel).
        widen = self.verdicts([r for r in self.rows
                               if r.get('case') not in ('lp-params', 'library')])
        for op, verdict in self.verdicts().items():
            names = names_of.get(op, {op})
            kind = _kind(verdict)
            if kind in _BAD:
                fp32 |= names
            elif (kind == 'ok' and self.machine.get('real_kernels') and op in keep32 and
                  _kind(widen.get(op, '')) == 'ok'):
                lp |= names & keep32
        return frozenset(lp), frozenset(fp32 - lp)

    def table(self):
        """The rows as a fixed-width text table, machine first."""
        m = self.machine
        head = ['%s conformance on %s (%s); MXNet %s; %s kernels%s; %s' % (
            self.target_dtype, m.get('cpu'), ' '.join(m.get('flags', [])) or 'no avx flags',
            m.get('mxnet_version'), 'real oneDNN' if m.get('real_kernels') else 'no oneDNN',
            (', DNNL_MAX_CPU_ISA=%s' % m['dnnl_max_cpu_isa']) if m.get('dnnl_max_cpu_isa')
            else '', m.get('date')),
            'tolerance: forward %.4g, backward %.4g (relative, max-norm)'
            % (self.tolerances['forward'], self.tolerances['backward'])]
        if m.get('tier') in MEANING:   # reports of check_kernels (not older files)
            head.insert(0, describe(m))
        cols = ('op', 'class', 'variant', 'case', 'mode', 'fwd err', 'bwd err', 'verdict')
        body = [(r['op'], r['class'], r['variant'] or '-', r['case'] or '-', r['mode'] or '-',
                 _fmt_err(r['fwd_err']), _fmt_err(r['bwd_err']),
                 r['verdict'] + (': ' + r['detail'] if r['detail'] else ''))
                for r in self.rows]
        widths = [max([len(c)] + [len(b[i]) for b in body]) for i, c in enumerate(cols)]
        widths[-1] = len(cols[-1])
        line = lambda cells: '  '.join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
        counts = collections.Counter(_kind(r['verdict']) for r in self.rows)
        summary = ', '.join('%d %s' % (n, k) for k, n in sorted(counts.items()))
        return '\n'.join(head + [line(cols)] + [line(b) for b in body]
                         + ['%d cases: %s' % (len(self.rows), summary)])

    def to_dict(self):
        """The JSON-ready dict :meth:`save` writes."""
        return {'format': FORMAT, 'version': VERSION, 'target_dtype': self.target_dtype,
                'machine': self.machine, 'tolerances': self.tolerances,
                'aliases': self.aliases, 'rows': self.rows}

    def save(self, path):
        """Write the report as JSON to ``path`` (a file name), atomically."""
        write_atomic(path, json.dumps(self.to_dict(), indent=1, sort_keys=True) + '\n')


def _kind(verdict):
    """The verdict without its detail: ``'crash'`` for ``'crash(SIGSEGV)'``."""
    return verdict.split('(')[0]


def _rank(verdict):
    return 2 if _kind(verdict) in _BAD else (1 if verdict == 'ok' else 0)


def load_kernel_report(path):
    """The :class:`KernelReport` of the JSON file ``path`` (:meth:`KernelReport.save`).

    Raises:
        ValueError: not JSON, not a kernel report, another version, or a malformed row.
    """
    fix = 'write one with `mxmp check-kernels --out FILE` on the machine it describes'
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError('%s is not a kernel report: not JSON (%s); %s' % (path, exc, fix))
    if not isinstance(data, dict) or data.get('format') != FORMAT:
        raise ValueError('%s is not a kernel report (no "format": "%s" field); %s'
                         % (path, FORMAT, fix))
    if data.get('version') != VERSION:
        raise ValueError('%s is a kernel report of version %r; this mxmp reads version %d; %s'
                         % (path, data.get('version'), VERSION, fix))
    for key in ('target_dtype', 'machine', 'rows', 'tolerances'):
        if key not in data:
            raise ValueError('%s: kernel report without "%s"; %s' % (path, key, fix))
    if data['target_dtype'] not in ('bfloat16', 'float16'):
        raise ValueError('%s: unknown target_dtype %r' % (path, data['target_dtype']))
    if not isinstance(data['rows'], list):
        raise ValueError('%s: "rows" must be a list' % path)
    for i, row in enumerate(data['rows']):
        missing = [k for k in _ROW_KEYS if not isinstance(row, dict) or k not in row]
        if missing:
            raise ValueError('%s: row %d lacks %s; %s' % (path, i, ', '.join(missing), fix))
        if _kind(row['verdict']) not in VERDICTS:
            raise ValueError('%s: row %d (%s) has unknown verdict %r (one of %s)'
                             % (path, i, row['op'], row['verdict'], ', '.join(VERDICTS)))
    return KernelReport(target_dtype=data['target_dtype'], machine=data['machine'],
                        rows=data['rows'], tolerances=data['tolerances'],
                        aliases=data.get('aliases', {}))
