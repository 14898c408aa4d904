package kappa.jvm;

import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import javax.management.MBeanServer;
import javax.management.ObjectName;

/**
 * The JIT of a job's JVM once its work is small: C2 left out for every method compiled from now on.
 *
 * A local job's JVM runs with the full tiered JIT, since C2 halves the CPU of a backfill's per-record
 * work. Once the job serves live micro-batches of a few records, C2 costs more than it gains: Spark
 * generates new classes for every plan (each MERGE's), and the compile threads took 38.7 of a live job's
 * 91.9 CPU-s in {@code kappa bench freshness}. A compiler directive (HotSpot's, added at run time through the
 * DiagnosticCommand MBean, as {@code jcmd Compiler.directives_add} does) excludes C2 from here on: code
 * C2 compiled already stays, and what becomes hot later is compiled by C1.
 */
public final class Jit {
    private Jit() {}

    /** The directive that leaves every method to C1. */
    public static final String C1_ONLY = "[{match: \"*.*\", c2: {Exclude: true}}]";

    /** Add {@link #C1_ONLY}; returns what the JVM answered ("1 compiler directives added"). */
    public static String leaveToC1() throws Exception {
        Path file = Files.createTempFile("kappa-jit-", ".json");
        try {
            Files.write(file, C1_ONLY.getBytes(StandardCharsets.UTF_8));
            return dcmd("compilerDirectivesAdd", file.toString());
        } finally {
            Files.deleteIfExists(file);
        }
    }

    /** The JVM's compiler directives, as {@code jcmd Compiler.directives_print} prints them. */
    public static String directives() throws Exception {
        return dcmd("compilerDirectivesPrint");
    }

    private static String dcmd(String operation, String... args) throws Exception {
        MBeanServer server = ManagementFactory.getPlatformMBeanServer();
        ObjectName name = new ObjectName("com.sun.management:type=DiagnosticCommand");
        Object out = server.invoke(name, operation, new Object[] {args}, new String[] {String[].class.getName()});
        return out == null ? "" : out.toString();
    }
}
