package kappa.jvm;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.core.StreamReadConstraints;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF2;

/**
 * A Kafka record's value read as a flat JSON object, in one pass, as strictly as Python's json reads it.
 *
 * <p>{@code call(value, "name,title,...")} returns two arrays, in the order of the names: the type of
 * each named top-level field ({@code "string"}, {@code "boolean"}, {@code "null"}, {@code "other"} for a
 * number, object or array; null when absent) and its text (a string's, a boolean's {@code true} or
 * {@code false}; else null). Registered by {@code jobs/lib/runtime/jvm.py}, read by
 * {@code jobs/lib/source/json_values.py}.
 * It returns null, and leaves the value to the job's exact parser, wherever its reading might differ
 * from Python's: bytes that are not strict UTF-8 or start with a byte-order mark, anything Jackson
 * refuses (its defaults refuse NaN, comments, single quotes, leading zeros, control characters in
 * strings, bad escapes), a value that is not one object with nothing but JSON whitespace after it, a
 * named field given twice, a named field's string with a lone surrogate, nesting deeper than 64 or a
 * number longer than 1000 characters (Python's own limits lie beyond those).
 */
public final class JsonFields implements UDF2<byte[], String, Row> {
    private static final long serialVersionUID = 1L;
    private static final JsonFactory JSON = JsonFactory.builder()
            .streamReadConstraints(StreamReadConstraints.builder().maxNestingDepth(64).maxNumberLength(1000).build())
            .build();

    private transient String spec;
    private transient String[] names;
    private transient char[] chars;

    @Override
    public Row call(byte[] value, String fields) {
        if (value == null) {
            return null;
        }
        if (!fields.equals(spec)) {
            names = fields.split(",", -1);
            spec = fields;
        }
        if (chars == null || chars.length < value.length) {
            chars = new char[Math.max(value.length, 256)];
        }
        int length = decode(value, chars);
        if (length < 0) {
            return null;
        }
        int n = names.length;
        String[] types = new String[n];
        String[] texts = new String[n];
        try (JsonParser p = JSON.createParser(chars, 0, length)) {
            if (p.nextToken() != JsonToken.START_OBJECT) {
                return null;
            }
            JsonToken t;
            while ((t = p.nextToken()) == JsonToken.FIELD_NAME) {
                int i = indexOf(p.currentName());
                JsonToken v = p.nextToken();
                if (i < 0) {
                    if (v == JsonToken.START_OBJECT || v == JsonToken.START_ARRAY) {
                        p.skipChildren();
                    }
                    continue;
                }
                if (types[i] != null) {
                    return null;
                }
                switch (v) {
                    case VALUE_STRING: {
                        String s = p.getText();
                        if (loneSurrogate(s)) {
                            return null;
                        }
                        types[i] = "string";
                        texts[i] = s;
                        break;
                    }
                    case VALUE_NULL:
                        types[i] = "null";
                        break;
                    case VALUE_TRUE:
                        types[i] = "boolean";
                        texts[i] = "true";
                        break;
                    case VALUE_FALSE:
                        types[i] = "boolean";
                        texts[i] = "false";
                        break;
                    case START_OBJECT:
                    case START_ARRAY:
                        p.skipChildren();
                        types[i] = "other";
                        break;
                    default:
                        types[i] = "other";
                }
            }
            if (t != JsonToken.END_OBJECT || p.nextToken() != null) {
                return null;
            }
        } catch (Exception e) {   // whatever Jackson refuses, the exact parser words
            return null;
        }
        return RowFactory.create(types, texts);
    }

    private int indexOf(String name) {
        String[] ns = names;
        for (int i = 0; i < ns.length; i++) {
            if (ns[i].equals(name)) {
                return i;
            }
        }
        return -1;
    }

    private static boolean loneSurrogate(String s) {
        for (int i = 0, n = s.length(); i < n; i++) {
            char c = s.charAt(i);
            if (Character.isHighSurrogate(c)) {
                if (i + 1 >= n || !Character.isLowSurrogate(s.charAt(i + 1))) {
                    return true;
                }
                i++;
            } else if (Character.isLowSurrogate(c)) {
                return true;
            }
        }
        return false;
    }

    /** Strict UTF-8 (what Python's decoder takes) into UTF-16 chars; -1 for anything else or a leading BOM. */
    static int decode(byte[] b, char[] out) {
        int n = b.length;
        if (n >= 3 && (b[0] & 0xff) == 0xef && (b[1] & 0xff) == 0xbb && (b[2] & 0xff) == 0xbf) {
            return -1;
        }
        int i = 0;
        int o = 0;
        while (i < n) {
            int c = b[i] & 0xff;
            if (c < 0x80) {
                out[o++] = (char) c;
                i++;
            } else if (c >= 0xc2 && c <= 0xdf) {
                if (i + 1 >= n || (b[i + 1] & 0xc0) != 0x80) {
                    return -1;
                }
                out[o++] = (char) (((c & 0x1f) << 6) | (b[i + 1] & 0x3f));
                i += 2;
            } else if (c >= 0xe0 && c <= 0xef) {
                if (i + 2 >= n) {
                    return -1;
                }
                int c1 = b[i + 1] & 0xff;
                int c2 = b[i + 2] & 0xff;
                if ((c1 & 0xc0) != 0x80 || (c2 & 0xc0) != 0x80 || (c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 >= 0xa0)) {
                    return -1;
                }
                out[o++] = (char) (((c & 0x0f) << 12) | ((c1 & 0x3f) << 6) | (c2 & 0x3f));
                i += 3;
            } else if (c >= 0xf0 && c <= 0xf4) {
                if (i + 3 >= n) {
                    return -1;
                }
                int c1 = b[i + 1] & 0xff;
                int c2 = b[i + 2] & 0xff;
                int c3 = b[i + 3] & 0xff;
                if ((c1 & 0xc0) != 0x80 || (c2 & 0xc0) != 0x80 || (c3 & 0xc0) != 0x80
                        || (c == 0xf0 && c1 < 0x90) || (c == 0xf4 && c1 >= 0x90)) {
                    return -1;
                }
                int cp = ((c & 0x07) << 18) | ((c1 & 0x3f) << 12) | ((c2 & 0x3f) << 6) | (c3 & 0x3f);
                out[o++] = Character.highSurrogate(cp);
                out[o++] = Character.lowSurrogate(cp);
                i += 4;
            } else {
                return -1;
            }
        }
        return o;
    }
}
