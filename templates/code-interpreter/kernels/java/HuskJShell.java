// husk's Java bridge: runs cells of Java with the JDK's JShell API (jdk.jshell), for husk's
// Java kernel (husk_java_kernel.py), which speaks Jupyter's protocol and drives this process
// over its stdin and stdout. One line a message; every field base64 (UTF-8 text, or the raw
// bytes code printed):
//
//   in:  exec <code>          run a cell
//        stop                 interrupt the running cell (JShell's stop)
//   out: ready <version>      once, when JShell is up
//        out <bytes>          what the cell printed to System.out (as it comes)
//        err <bytes>          ... to System.err
//        value <text>         the value of the cell's last snippet, when it is an expression
//        error <name> <message> <traceback>
//        done                 the cell is over
//
// The cell runs in this JVM (JShell's local execution engine): what it prints reaches
// System.out and System.err, which are replaced by streams that send it, so output and the
// cell's end arrive in order. The protocol writes to the original stdout.

import java.io.ByteArrayOutputStream;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.stream.Collectors;

import jdk.jshell.Diag;
import jdk.jshell.EvalException;
import jdk.jshell.ExpressionSnippet;
import jdk.jshell.JShell;
import jdk.jshell.Snippet;
import jdk.jshell.SnippetEvent;
import jdk.jshell.SourceCodeAnalysis;
import jdk.jshell.UnresolvedReferenceException;
import jdk.jshell.VarSnippet;

public final class HuskJShell {
    private static PrintStream proto;

    private static String b64(byte[] b) {
        return Base64.getEncoder().encodeToString(b);
    }

    private static String b64(String s) {
        return b64(s.getBytes(StandardCharsets.UTF_8));
    }

    private static synchronized void send(String kind, String... fields) {
        StringBuilder line = new StringBuilder(kind);
        for (String f : fields) {
            line.append(' ').append(f);
        }
        line.append('\n');
        proto.print(line);
        proto.flush();
    }

    /** What the cell prints, sent as it comes (a line at a time, or each write). */
    private static final class Forward extends OutputStream {
        private final String kind;
        private final ByteArrayOutputStream buf = new ByteArrayOutputStream();

        Forward(String kind) {
            this.kind = kind;
        }

        @Override
        public synchronized void write(int b) {
            buf.write(b);
            if (b == '\n' || buf.size() >= 8192) {
                flush();
            }
        }

        @Override
        public synchronized void write(byte[] b, int off, int len) {
            buf.write(b, off, len);
            flush();
        }

        @Override
        public synchronized void flush() {
            if (buf.size() > 0) {
                send(kind, b64(buf.toByteArray()));
                buf.reset();
            }
        }
    }

    public static void main(String[] args) throws Exception {
        proto = new PrintStream(new java.io.FileOutputStream(java.io.FileDescriptor.out), true,
                StandardCharsets.UTF_8);
        PrintStream out = new PrintStream(new Forward("out"), true, StandardCharsets.UTF_8);
        PrintStream err = new PrintStream(new Forward("err"), true, StandardCharsets.UTF_8);
        System.setOut(out);
        System.setErr(err);
        JShell shell = JShell.builder().executionEngine("local").out(out).err(err).build();
        // Warm up the compiler and the execution engine before the first cell.
        shell.eval("int __husk_warm = 1;");
        LinkedBlockingQueue<String> cells = new LinkedBlockingQueue<>();
        Thread reader = new Thread(() -> {
            try (BufferedReader in = new BufferedReader(
                    new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
                String line;
                while ((line = in.readLine()) != null) {
                    if (line.equals("stop")) {
                        shell.stop();
                    } else if (line.startsWith("exec ")) {
                        cells.put(new String(Base64.getDecoder().decode(line.substring(5)),
                                StandardCharsets.UTF_8));
                    }
                }
            } catch (Exception e) {
                // The kernel is gone: end.
            }
            System.exit(0);
        }, "husk-stdin");
        reader.setDaemon(true);
        reader.start();
        send("ready", b64(System.getProperty("java.version")));
        while (true) {
            String code = cells.take();
            try {
                run(shell, code);
            } catch (Throwable t) {
                send("error", b64(t.getClass().getName()), b64(String.valueOf(t.getMessage())),
                        b64(t.toString()));
            }
            out.flush();
            err.flush();
            send("done");
        }
    }

    /** Runs a cell snippet by snippet, stopping at the first that fails. */
    private static void run(JShell shell, String code) {
        SourceCodeAnalysis sca = shell.sourceCodeAnalysis();
        String rest = code;
        String value = null;
        while (!rest.isBlank()) {
            SourceCodeAnalysis.CompletionInfo info = sca.analyzeCompletion(rest);
            String source;
            switch (info.completeness()) {
                case COMPLETE:
                case COMPLETE_WITH_SEMI:
                    source = info.source();
                    rest = info.remaining();
                    break;
                case EMPTY:
                    return;
                default:
                    // Incomplete or unknown: all of it, and the compiler says what is wrong.
                    source = rest;
                    rest = "";
            }
            value = null;
            for (SnippetEvent ev : shell.eval(source)) {
                if (ev.causeSnippet() != null) {
                    continue;
                }
                if (ev.exception() != null) {
                    fail(ev.exception());
                    return;
                }
                if (ev.status() == Snippet.Status.REJECTED) {
                    rejected(shell, ev.snippet(), source);
                    return;
                }
                value = valueOf(ev);
            }
        }
        if (value != null) {
            send("value", b64(value));
        }
    }

    /** The value to show for a snippet: an expression's (strings without their quotes). */
    private static String valueOf(SnippetEvent ev) {
        Snippet s = ev.snippet();
        boolean expression = s instanceof ExpressionSnippet
                || (s instanceof VarSnippet
                    && s.subKind() == Snippet.SubKind.TEMP_VAR_EXPRESSION_SUBKIND);
        if (!expression || ev.value() == null) {
            return null;
        }
        String type = s instanceof VarSnippet ? ((VarSnippet) s).typeName()
                : ((ExpressionSnippet) s).typeName();
        String v = ev.value();
        if (type.equals("String") && v.length() >= 2 && v.startsWith("\"") && v.endsWith("\"")) {
            return unquote(v.substring(1, v.length() - 1));
        }
        return v;
    }

    private static String unquote(String s) {
        StringBuilder b = new StringBuilder();
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c != '\\' || i + 1 == s.length()) {
                b.append(c);
                continue;
            }
            char n = s.charAt(++i);
            switch (n) {
                case 'n': b.append('\n'); break;
                case 't': b.append('\t'); break;
                case 'r': b.append('\r'); break;
                case 'b': b.append('\b'); break;
                case 'f': b.append('\f'); break;
                case '0': b.append('\0'); break;
                default: b.append(n);
            }
        }
        return b.toString();
    }

    private static void fail(Exception e) {
        String name;
        String message;
        if (e instanceof EvalException) {
            name = ((EvalException) e).getExceptionClassName();
            message = e.getMessage() == null ? "" : e.getMessage();
        } else if (e instanceof UnresolvedReferenceException) {
            name = "UnresolvedReferenceException";
            Snippet s = ((UnresolvedReferenceException) e).getSnippet();
            message = "unresolved reference in: " + s.source().strip();
        } else {
            name = e.getClass().getName();
            message = String.valueOf(e.getMessage());
        }
        List<String> tb = new ArrayList<>();
        tb.add(name + (message.isEmpty() ? "" : ": " + message));
        for (StackTraceElement el : e.getStackTrace()) {
            // JShell's own frames say nothing to the cell's author.
            if (el.getClassName().startsWith("jdk.jshell.")
                    || el.getClassName().startsWith("java.lang.reflect.")
                    || el.getClassName().startsWith("jdk.internal.")) {
                continue;
            }
            tb.add("\tat " + el);
        }
        send("error", b64(name), b64(message), b64(String.join("\n", tb)));
    }

    private static void rejected(JShell shell, Snippet s, String source) {
        List<String> lines = shell.diagnostics(s).map(d -> describe(d, source))
                .collect(Collectors.toList());
        if (lines.isEmpty()) {
            lines.add("the snippet was rejected: " + source.strip());
        }
        String message = String.join("\n", lines);
        send("error", b64("CompilationException"), b64(message), b64(message));
    }

    private static String describe(Diag d, String source) {
        String msg = d.getMessage(Locale.ROOT);
        long pos = d.getStartPosition();
        if (pos < 0 || pos > source.length()) {
            return msg;
        }
        int start = source.lastIndexOf('\n', (int) Math.max(0, pos - 1)) + 1;
        int end = source.indexOf('\n', (int) pos);
        String line = source.substring(start, end < 0 ? source.length() : end);
        return msg + "\n" + line + "\n" + " ".repeat((int) pos - start) + "^";
    }
}
