#!/usr/bin/env python3
"""Run an MXNet ``dist_sync`` job on this machine: 1 scheduler, S servers, N workers, loopback only.

MXNet's parameter-server kvstore (``dist_sync``, ``dist_device_sync``, ``dist_async``) is built on
ps-lite: every process reads its role and the scheduler's address from ``DMLC_*`` environment
variables (ps-lite ``docs/env.md``; MXNet 1.9.1 ``python/mxnet/kvstore/kvstore_server.py``). This
launcher sets them itself, because ``mxnet/tools/launch.py --launcher local`` hung on the
project's machines (2-core AMD EPYC, MXNet 1.9.1 from PyPI):

==================== ==================================================================
``DMLC_ROLE``        ``scheduler``, ``server`` or ``worker``
``DMLC_PS_ROOT_URI`` ``127.0.0.1``: the scheduler's address
``DMLC_PS_ROOT_PORT`` a free TCP port on 127.0.0.1 (``--port``; default: asked from the OS)
``DMLC_NUM_SERVER``  S (``-s``)
``DMLC_NUM_WORKER``  N (``-n``)
``DMLC_NODE_HOST``   ``127.0.0.1``: the address servers and workers bind to and announce; without
                     it ps-lite picks the first non-loopback interface
                     (``GetAvailableInterfaceAndIP`` in ps-lite ``src/van.cc``)
==================== ==================================================================

ps-lite needs nothing else: the scheduler assigns the ranks (``kv.rank``) in the order the nodes
register, so ``kv.rank`` need not equal the launcher's index. The launcher also sets
``MXMP_LAUNCH_INDEX`` (its own index of the process: 0..N-1 for workers, 0..S-1 for servers) and
``MXMP_LAUNCH_ID`` (one random id per launch, which lets tests find stray processes), and
``DMLC_WORKER_ID`` = the launcher index for tools that read it (ps-lite does not).

Workers run ``COMMAND``. The scheduler and servers run ``SERVER_COMMAND`` (default: the
command's Python interpreter, when the command starts with one, else this interpreter, with
``-c "import mxnet"``): importing mxnet with ``DMLC_ROLE`` = ``server``/``scheduler`` runs the
server loop and exits when the workers are done (``kvstore_server._init_kvstore_server_module``).

Output: every line of every process is printed to this process's stdout with a prefix
``[scheduler]``, ``[server i]`` or ``[worker i]``.

Lifetime and teardown: every process runs in its own session (process group). The launcher
waits for the workers. Then:

* all workers exit 0: the scheduler and servers get ``--grace`` seconds to finish; exit code 0;
* a worker (or the scheduler or a server, before the workers are done) exits non-zero: every
  process is stopped; exit code = that process's code (128 + signal number if it was killed by a
  signal);
* ``--timeout`` seconds pass: everything is stopped; exit code 124 (as coreutils ``timeout``);
* Ctrl-C, SIGTERM or SIGHUP to the launcher: everything is stopped; exit code 130 / 143 / 129.

Stopping a process means SIGTERM to its process group, ``--kill-after`` seconds to exit, then
SIGKILL, then reaping it. Loopback only: nothing listens on another interface.

Example::

    python scripts/launch_local.py -n 2 -s 1 --timeout 300 -- \\
        python examples/train_imagenet.py --kvstore dist_sync --epochs 1
"""
import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

LOG = logging.getLogger('launch_local')

HOST = '127.0.0.1'
#: Exit code on --timeout, as coreutils ``timeout``.
TIMEOUT_EXIT_CODE = 124


class _Interrupted(Exception):
    """Raised from the signal handler: the launcher was asked to stop."""

    def __init__(self, signum):
        super().__init__('received %s' % signal.Signals(signum).name)
        self.signum = signum


def free_port(host=HOST):
    """Return a TCP port that is free on ``host`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def default_server_command(command):
    """The scheduler/server command for a worker ``command``: ``<python> -c "import mxnet"``."""
    first = os.path.basename(command[0]) if command else ''
    python = command[0] if first.startswith('python') else sys.executable
    return [python, '-c', 'import mxnet']


def exit_code_of(returncode):
    """Shell-style exit code: ``returncode``, or 128 + N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


class Proc:
    """One launched process: its name (``worker 0``), Popen object and output pump thread."""

    def __init__(self, name, role, argv, env, out, out_lock):
        self.name, self.role = name, role
        self.popen = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        self._thread = threading.Thread(target=self._pump, args=(out, out_lock),
                                        name='pump-' + name, daemon=True)
        self._thread.start()

    def _pump(self, out, lock):
        prefix = ('[%s] ' % self.name).encode()
        for line in iter(self.popen.stdout.readline, b''):
            if not line.endswith(b'\n'):
                line += b'\n'
            with lock:
                out.write(prefix + line)
                out.flush()
        self.popen.stdout.close()

    @property
    def pid(self):
        return self.popen.pid

    def poll(self):
        return self.popen.poll()

    def signal_group(self, signum):
        """Send ``signum`` to the process group; False if it is gone already."""
        try:
            os.killpg(self.popen.pid, signum)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def join_output(self, timeout=5.0):
        self._thread.join(timeout)


class Launcher:
    """Start, watch and stop the processes of one local dist kvstore job (see module docs)."""

    def __init__(self, command, num_workers, num_servers, timeout=None, port=None,
                 server_command=None, grace=30.0, kill_after=5.0, extra_env=None,
                 out=None):
        if num_workers < 1:
            raise ValueError('need at least one worker (-n), got %d' % num_workers)
        if num_servers < 1:
            raise ValueError('need at least one server (-s), got %d' % num_servers)
        if not command:
            raise ValueError('no command given: put it after "--", e.g. '
                             '"launch_local.py -n 2 -- python train.py --kvstore dist_sync"')
        if timeout is not None and timeout <= 0:
            raise ValueError('--timeout must be > 0 seconds, got %r' % timeout)
        self.command = list(command)
        self.num_workers, self.num_servers = num_workers, num_servers
        self.timeout, self.grace, self.kill_after = timeout, grace, kill_after
        self.port = port or free_port()
        self.server_command = list(server_command or default_server_command(self.command))
        self.extra_env = dict(extra_env or {})
        self.launch_id = uuid.uuid4().hex
        self.out = out if out is not None else sys.stdout.buffer
        self._out_lock = threading.Lock()
        self.procs = []

    def _env(self, role, index):
        env = dict(os.environ)
        env.update(self.extra_env)
        env.update({
            'DMLC_ROLE': role,
            'DMLC_PS_ROOT_URI': HOST,
            'DMLC_PS_ROOT_PORT': str(self.port),
            'DMLC_NUM_SERVER': str(self.num_servers),
            'DMLC_NUM_WORKER': str(self.num_workers),
            'DMLC_NODE_HOST': HOST,
            'MXMP_LAUNCH_ID': self.launch_id,
            'MXMP_LAUNCH_INDEX': str(index),
            'PYTHONUNBUFFERED': '1',
        })
        if role == 'worker':
            env['DMLC_WORKER_ID'] = str(index)
        elif role == 'server':
            env['DMLC_SERVER_ID'] = str(index)
        return env

    def _start(self, name, role, index, argv):
        LOG.info('starting %s: %s', name, ' '.join(argv))
        proc = Proc(name, role, argv, self._env(role, index), self.out, self._out_lock)
        self.procs.append(proc)
        return proc

    def start(self):
        """Start the scheduler, the servers and the workers."""
        LOG.info('scheduler on %s:%d, %d server(s), %d worker(s), launch id %s', HOST,
                 self.port, self.num_servers, self.num_workers, self.launch_id)
        self._start('scheduler', 'scheduler', 0, self.server_command)
        for i in range(self.num_servers):
            self._start('server %d' % i, 'server', i, self.server_command)
        for i in range(self.num_workers):
            self._start('worker %d' % i, 'worker', i, self.command)

    def _workers(self):
        return [p for p in self.procs if p.role == 'worker']

    def wait(self, poll=0.1):
        """Wait for the job; return the launcher's exit code (see module docs). No teardown."""
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            for proc in self.procs:
                code = proc.poll()
                if code is not None and code != 0:
                    LOG.error('%s (pid %d) failed with exit code %d; stopping the others',
                              proc.name, proc.pid, exit_code_of(code))
                    return exit_code_of(code)
            if all(p.poll() == 0 for p in self._workers()):
                break
            if deadline is not None and time.monotonic() > deadline:
                LOG.error('timeout: the job ran longer than %g s; stopping every process',
                          self.timeout)
                return TIMEOUT_EXIT_CODE
            time.sleep(poll)
        LOG.info('all %d worker(s) finished', self.num_workers)
        end = time.monotonic() + self.grace
        if deadline is not None:
            end = min(end, deadline)
        while time.monotonic() < end and any(p.poll() is None for p in self.procs):
            time.sleep(poll)
        for proc in self.procs:
            code = proc.poll()
            if code is None:
                LOG.warning('%s (pid %d) still runs %g s after the workers finished; '
                            'stopping it', proc.name, proc.pid, self.grace)
            elif code != 0:
                LOG.warning('%s exited with code %d after the workers finished', proc.name,
                            exit_code_of(code))
        return 0

    def teardown(self):
        """Stop every process group: SIGTERM, ``kill_after`` seconds, SIGKILL; reap them all."""
        alive = [p for p in self.procs if p.poll() is None]
        # Also signal groups whose leader exited: a child it left behind may still run.
        for proc in self.procs:
            proc.signal_group(signal.SIGTERM)
        end = time.monotonic() + self.kill_after
        while alive and time.monotonic() < end:
            alive = [p for p in alive if p.poll() is None]
            time.sleep(0.05)
        for proc in self.procs:
            if proc.signal_group(signal.SIGKILL) and proc in alive:
                LOG.warning('%s (pid %d) ignored SIGTERM for %g s: killed', proc.name,
                            proc.pid, self.kill_after)
        for proc in self.procs:
            try:
                proc.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                LOG.error('%s (pid %d) could not be reaped', proc.name, proc.pid)
            proc.join_output()

    def run(self):
        """Start, wait, tear down; return the exit code. Signals end the job (see module docs)."""
        def on_signal(signum, frame):
            del frame
            raise _Interrupted(signum)

        handled = (signal.SIGTERM, signal.SIGHUP)
        previous = {}
        if threading.current_thread() is threading.main_thread():
            previous = {s: signal.signal(s, on_signal) for s in handled}
        try:
            self.start()
            return self.wait()
        except KeyboardInterrupt:
            LOG.error('interrupted (Ctrl-C); stopping every process')
            return 128 + signal.SIGINT
        except _Interrupted as err:
            LOG.error('%s; stopping every process', err)
            return 128 + err.signum
        finally:
            # A second signal during the teardown must not abort it.
            for s in handled + (signal.SIGINT,):
                if threading.current_thread() is threading.main_thread():
                    signal.signal(s, signal.SIG_IGN)
            try:
                self.teardown()
            finally:
                if threading.current_thread() is threading.main_thread():
                    signal.signal(signal.SIGINT, signal.default_int_handler)
                    for s, handler in previous.items():
                        signal.signal(s, handler)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage='%(prog)s [-h] -n N [-s S] [--timeout SEC] [options] -- COMMAND [ARG ...]',
        epilog='Example: %(prog)s -n 2 -s 1 --timeout 300 -- python '
               'examples/train_imagenet.py --kvstore dist_sync')
    parser.add_argument('-n', '--num-workers', type=int, required=True,
                        help='number of worker processes (DMLC_NUM_WORKER)')
    parser.add_argument('-s', '--num-servers', type=int, default=1,
                        help='number of server processes (DMLC_NUM_SERVER); default 1')
    parser.add_argument('--timeout', type=float, default=None,
                        help='stop everything after this many seconds and exit with 124 '
                             '(default: no limit)')
    parser.add_argument('--port', type=int, default=None,
                        help='scheduler port on 127.0.0.1 (default: a free port)')
    parser.add_argument('--server-command', default=None,
                        help='command of the scheduler and servers, split on spaces '
                             '(default: the command\'s python -c "import mxnet")')
    parser.add_argument('--grace', type=float, default=30.0,
                        help='seconds the scheduler and servers get to exit after the '
                             'workers finished (default 30)')
    parser.add_argument('--kill-after', type=float, default=5.0,
                        help='seconds between SIGTERM and SIGKILL at teardown (default 5)')
    parser.add_argument('--env', action='append', default=[], metavar='KEY=VALUE',
                        help='extra environment variable for every process (repeatable)')
    parser.add_argument('-v', '--verbose', action='store_true', help='debug logging')
    parser.add_argument('command', nargs=argparse.REMAINDER,
                        help='the worker command, after "--"')
    args = parser.parse_args(argv)
    if args.command and args.command[0] == '--':
        args.command = args.command[1:]
    if not args.command:
        parser.error('no command given: put it after "--"')
    if args.num_workers < 1 or args.num_servers < 1:
        parser.error('-n and -s must be >= 1')
    if args.timeout is not None and args.timeout <= 0:
        parser.error('--timeout must be > 0')
    env = {}
    for item in args.env:
        key, sep, value = item.partition('=')
        if not sep or not key:
            parser.error('--env takes KEY=VALUE, got %r' % item)
        env[key] = value
    args.env = env
    return args


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format='[launcher] %(levelname)s %(message)s', stream=sys.stderr)
    launcher = Launcher(args.command, args.num_workers, args.num_servers,
                        timeout=args.timeout, port=args.port,
                        server_command=args.server_command.split()
                        if args.server_command else None,
                        grace=args.grace, kill_after=args.kill_after, extra_env=args.env)
    code = launcher.run()
    LOG.info('exit code %d', code)
    return code


if __name__ == '__main__':
    sys.exit(main())
