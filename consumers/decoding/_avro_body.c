/* Avro bodies to table rows, in one C loop per batch.
 *
 * Ours, not a library's: fastavro and cavro read a value field by field through Python calls
 * (with fastavro the consumer ran at 0.29x of JSON, bench/results/typed-20261125T140439Z.json),
 * and no library turns an Avro body straight into a tuple of a table's columns.
 *
 * A writer schema arrives compiled (consumers/decoding/avro_program.py) into nodes, each a tuple whose
 * first item is an opcode below. `decode_rows` reads every value of a list by one compiled
 * record into one tuple per value: the column a field feeds gets its value, the other columns
 * keep the template's. The Python values are those fastavro gives, so that psycopg sends each
 * as its exact PostgreSQL type: datetimes (aware for timestamp-*, naive for local-timestamp-*),
 * dates, times, Decimals with every digit, str, bytes, lists for arrays, dicts for maps and
 * records. Anything that does not read (a value cut short, a length or an index out of range,
 * bytes left over, text that is not UTF-8) raises ValueError naming what and where.
 *
 * A body is outside input, and so is the schema it is read by (anyone who reaches the registry
 * can register one): the schema's numbers are checked when it is compiled, and here every value
 * read is charged to the record's budget of decoded bytes before it is made, so that a few bytes
 * cannot grow into millions of objects (an array of nulls, of empty records, a decimal with a
 * huge scale); nesting is bounded by MAX_DEPTH, without recursing in C beyond it. ValueError is
 * the only error a body or a compiled schema can raise.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <datetime.h>
#include <stdint.h>
#include <string.h>

/* Keep in step with consumers/decoding/avro_program.py. */
enum {
    OP_NULL = 0,
    OP_BOOLEAN = 1,
    OP_INT = 2,
    OP_LONG = 3,
    OP_FLOAT = 4,
    OP_DOUBLE = 5,
    OP_STRING = 6,
    OP_BYTES = 7,
    OP_FIXED = 8,             /* (op, size) */
    OP_ENUM = 9,              /* (op, symbols) */
    OP_UNION = 10,            /* (op, branches) */
    OP_ARRAY = 11,            /* (op, items) */
    OP_MAP = 12,              /* (op, values) */
    OP_RECORD = 13,           /* (op, names, fields): a record inside a value, as a dict */
    OP_DECIMAL_BYTES = 14,    /* (op, scale) */
    OP_DECIMAL_FIXED = 15,    /* (op, size, scale) */
    OP_DATE = 16,
    OP_TIME_MILLIS = 17,
    OP_TIME_MICROS = 18,
    OP_TIMESTAMP_MILLIS = 19,
    OP_TIMESTAMP_MICROS = 20,
    OP_LOCAL_TIMESTAMP_MILLIS = 21,
    OP_LOCAL_TIMESTAMP_MICROS = 22,
};

/* How deep values may nest (unions, arrays, maps, records inside the top record). */
#define MAX_DEPTH 64
/* What a value is charged, roughly what CPython spends on it (64-bit): a reference in its
 * container, and the object itself unless it is shared (None, booleans, enum symbols). */
#define COST_SLOT 8
#define COST_OBJECT 64

typedef struct {
    const unsigned char *start;
    const unsigned char *p;
    const unsigned char *end;
    int depth;
    long long budget; /* decoded bytes this record may still take */
    long long limit;
} Cursor;

static PyObject *decimal_type; /* decimal.Decimal */
static PyObject *int_from_bytes; /* int.from_bytes */
static PyObject *big_signed; /* the arguments after the bytes: ("big",), {"signed": True} */
static PyObject *signed_kwargs;

static void *fail(const Cursor *c, const char *what) {
    PyErr_Format(PyExc_ValueError, "%s at byte %zd of the body", what, (Py_ssize_t)(c->p - c->start));
    return NULL;
}

/* Charge `cost` decoded bytes to the record, or fail naming the limit. */
static int charge(Cursor *c, long long cost) {
    if (cost < 0 || cost > c->budget) {
        PyErr_Format(PyExc_ValueError,
                     "the record decodes to more than %lld bytes at byte %zd of the body (the "
                     "limit is consumer.max_decoded_record_bytes)",
                     c->limit, (Py_ssize_t)(c->p - c->start));
        return -1;
    }
    c->budget -= cost;
    return 0;
}

static int read_long(Cursor *c, int64_t *out) {
    uint64_t value = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (c->p >= c->end) {
            fail(c, "the value ends inside a number");
            return -1;
        }
        unsigned char b = *c->p++;
        value |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = (int64_t)((value >> 1) ^ (~(value & 1) + 1)); /* zigzag */
            return 0;
        }
    }
    fail(c, "a number longer than 10 bytes");
    return -1;
}

/* A length-prefixed run of bytes (bytes, string): its start, and the cursor moved past it. */
static const unsigned char *read_sized(Cursor *c, Py_ssize_t *size) {
    int64_t n;
    if (read_long(c, &n) < 0) return NULL;
    if (n < 0) return fail(c, "a negative length");
    if (n > c->end - c->p) return fail(c, "a length longer than the rest of the value");
    const unsigned char *at = c->p;
    c->p += n;
    *size = (Py_ssize_t)n;
    return at;
}

static const unsigned char *read_fixed(Cursor *c, Py_ssize_t size) {
    if (size < 0) return fail(c, "a fixed of negative size");
    if (size > c->end - c->p) return fail(c, "the value ends inside a fixed");
    const unsigned char *at = c->p;
    c->p += size;
    return at;
}

/* Howard Hinnant's days_from_civil, inverted: the date `days` after 1970-01-01. */
static void civil_from_days(int64_t days, int64_t *y, int *m, int *d) {
    days += 719468;
    int64_t era = (days >= 0 ? days : days - 146096) / 146097;
    int64_t doe = days - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153;
    *d = (int)(doy - (153 * mp + 2) / 5 + 1);
    *m = (int)(mp < 10 ? mp + 3 : mp - 9);
    *y = yoe + era * 400 + (*m <= 2);
}

/* Python's dates run from year 1 to 9999: 719162 days before 1970 to 2932896 after. */
#define DAYS_MIN (-719162LL)
#define DAYS_MAX (2932896LL)
#define MICROS_PER_DAY (86400000000LL)

static PyObject *date_of(Cursor *c, int64_t days) {
    if (days < DAYS_MIN || days > DAYS_MAX) return fail(c, "a date out of range");
    int64_t y;
    int m, d;
    civil_from_days(days, &y, &m, &d);
    return PyDate_FromDate((int)y, m, d);
}

static PyObject *time_of(Cursor *c, int64_t micros) {
    if (micros < 0 || micros >= MICROS_PER_DAY) return fail(c, "a time of day out of range");
    int64_t s = micros / 1000000;
    return PyTime_FromTime((int)(s / 3600), (int)(s / 60 % 60), (int)(s % 60), (int)(micros % 1000000));
}

static PyObject *timestamp_of(Cursor *c, int64_t micros, int aware) {
    int64_t days = micros / MICROS_PER_DAY;
    int64_t rest = micros % MICROS_PER_DAY;
    if (rest < 0) {
        rest += MICROS_PER_DAY;
        days -= 1;
    }
    if (days < DAYS_MIN || days > DAYS_MAX) return fail(c, "a timestamp out of range");
    int64_t y;
    int m, d;
    civil_from_days(days, &y, &m, &d);
    int64_t s = rest / 1000000;
    return PyDateTimeAPI->DateTime_FromDateAndTime(
        (int)y, m, d, (int)(s / 3600), (int)(s / 60 % 60), (int)(s % 60), (int)(rest % 1000000),
        aware ? PyDateTime_TimeZone_UTC : Py_None, PyDateTimeAPI->DateTimeType);
}

static int millis_to_micros(Cursor *c, int64_t millis, int64_t *micros) {
    if (millis > INT64_MAX / 1000 || millis < INT64_MIN / 1000) {
        fail(c, "a timestamp out of range");
        return -1;
    }
    *micros = millis * 1000;
    return 0;
}

/* `digits` (an optional '-' and the unscaled value's digits) with the point placed `scale`
 * digits from the right, as a Decimal: "-325" scale 2 is -3.25, "5" scale 3 is 0.005. */
static PyObject *placed_decimal(const char *digits, Py_ssize_t n, int64_t scale) {
    int negative = digits[0] == '-';
    const char *magnitude = digits + negative;
    Py_ssize_t width = n - negative;
    if (scale < 0 || scale > PY_SSIZE_T_MAX / 4) {
        PyErr_SetString(PyExc_ValueError, "a decimal scale out of range");
        return NULL;
    }
    Py_ssize_t whole = width > scale ? width - (Py_ssize_t)scale : 0;
    Py_ssize_t zeros = width > scale ? 0 : (Py_ssize_t)scale - width;
    Py_ssize_t length = negative + (whole ? whole : 1) + (scale ? 1 : 0) + zeros + width - whole;
    PyObject *text = PyUnicode_New(length, 127);
    if (text == NULL) return NULL;
    char *w = (char *)PyUnicode_DATA(text);
    if (negative) *w++ = '-';
    if (whole) {
        memcpy(w, magnitude, (size_t)whole);
        w += whole;
    } else {
        *w++ = '0';
    }
    if (scale) *w++ = '.';
    memset(w, '0', (size_t)zeros);
    w += zeros;
    memcpy(w, magnitude + whole, (size_t)(width - whole));
    PyObject *value = PyObject_CallOneArg(decimal_type, text);
    Py_DECREF(text);
    return value;
}

/* The two's-complement big-endian unscaled value of a decimal, with `scale` digits after the
 * point, as a Decimal holding every digit. */
static PyObject *decimal_of(Cursor *c, const unsigned char *at, Py_ssize_t size, int64_t scale) {
    /* Every byte of the unscaled value makes at most 3 digits; the scale adds leading zeros. */
    if (scale < 0 || scale > PY_SSIZE_T_MAX / 4) return fail(c, "a decimal scale out of range");
    if (charge(c, COST_OBJECT + 3 * (long long)size + (long long)scale + 24) < 0) return NULL;
    if (size <= 8) { /* fits an int64: its digits written here */
        uint64_t raw = 0;
        for (Py_ssize_t i = 0; i < size; i++) raw = (raw << 8) | at[i];
        if (size > 0 && size < 8 && (at[0] & 0x80)) raw |= ~(uint64_t)0 << (8 * size); /* sign */
        int negative = (int64_t)raw < 0;
        uint64_t magnitude = negative ? ~raw + 1 : raw;
        char buffer[24];
        char *end = buffer + sizeof buffer, *w = end;
        do {
            *--w = (char)('0' + magnitude % 10);
            magnitude /= 10;
        } while (magnitude);
        if (negative) *--w = '-';
        return placed_decimal(w, end - w, scale);
    }
    PyObject *raw = PyBytes_FromStringAndSize((const char *)at, size);
    if (raw == NULL) return NULL;
    PyObject *args = PyTuple_Pack(2, raw, PyTuple_GET_ITEM(big_signed, 0));
    Py_DECREF(raw);
    if (args == NULL) return NULL;
    PyObject *unscaled = PyObject_Call(int_from_bytes, args, signed_kwargs);
    Py_DECREF(args);
    if (unscaled == NULL) return NULL;
    PyObject *digits = PyObject_Str(unscaled);
    Py_DECREF(unscaled);
    if (digits == NULL) return NULL;
    Py_ssize_t n;
    const char *text = PyUnicode_AsUTF8AndSize(digits, &n);
    PyObject *value = text == NULL ? NULL : placed_decimal(text, n, scale);
    Py_DECREF(digits);
    return value;
}

static PyObject *decode(Cursor *c, PyObject *node);

/* Whether a value of `node` may take no bytes of the body: a null, a fixed of size 0, or (not
 * looked into, as it may be recursive) a record. Those are bounded by the budget alone. */
static int may_be_empty(PyObject *node) {
    long op = PyLong_AsLong(PyTuple_GET_ITEM(node, 0));
    if (op == OP_NULL || op == OP_RECORD) return 1;
    if (op == OP_FIXED || op == OP_DECIMAL_FIXED) return PyLong_AsSsize_t(PyTuple_GET_ITEM(node, 1)) == 0;
    return 0;
}

/* The items of an array or a map come in blocks: a count (negative: its absolute value, then
 * the block's size in bytes), the items, and a count of 0 at the end. Each item's reference is
 * charged for the whole block before any is read. */
static int read_block_count(Cursor *c, PyObject *item_node, long long slot, int64_t *count) {
    if (read_long(c, count) < 0) return -1;
    if (*count < 0) {
        int64_t size;
        if (*count == INT64_MIN) {
            fail(c, "a block count out of range");
            return -1;
        }
        *count = -*count;
        if (read_long(c, &size) < 0) return -1;
    }
    /* Most items take a byte at least: no more of them than bytes left. */
    int64_t left = c->end - c->p;
    if (*count > left && !may_be_empty(item_node)) {
        fail(c, "a block of more items than the value has bytes");
        return -1;
    }
    if (*count > c->budget / slot) return charge(c, c->budget + 1);
    return charge(c, *count * slot);
}

static PyObject *decode_array(Cursor *c, PyObject *items) {
    if (charge(c, COST_OBJECT) < 0) return NULL;
    PyObject *list = PyList_New(0);
    if (list == NULL) return NULL;
    for (;;) {
        int64_t count;
        if (read_block_count(c, items, COST_SLOT, &count) < 0) goto error;
        if (count == 0) return list;
        for (int64_t i = 0; i < count; i++) {
            PyObject *item = decode(c, items);
            if (item == NULL) goto error;
            int failed = PyList_Append(list, item);
            Py_DECREF(item);
            if (failed) goto error;
        }
    }
error:
    Py_DECREF(list);
    return NULL;
}

static PyObject *decode_map(Cursor *c, PyObject *values) {
    if (charge(c, COST_OBJECT) < 0) return NULL;
    PyObject *dict = PyDict_New();
    if (dict == NULL) return NULL;
    for (;;) {
        int64_t count;
        if (read_block_count(c, values, COST_OBJECT, &count) < 0) goto error;
        if (count == 0) return dict;
        for (int64_t i = 0; i < count; i++) {
            Py_ssize_t size;
            const unsigned char *at = read_sized(c, &size);
            if (at == NULL) goto error;
            PyObject *key = PyUnicode_DecodeUTF8((const char *)at, size, NULL);
            if (key == NULL) goto error;
            PyObject *value = decode(c, values);
            if (value == NULL) {
                Py_DECREF(key);
                goto error;
            }
            int failed = PyDict_SetItem(dict, key, value);
            Py_DECREF(key);
            Py_DECREF(value);
            if (failed) goto error;
        }
    }
error:
    Py_DECREF(dict);
    return NULL;
}

static PyObject *decode_record(Cursor *c, PyObject *names, PyObject *fields) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fields);
    if (charge(c, COST_OBJECT + (long long)n * COST_OBJECT) < 0) return NULL;
    PyObject *dict = PyDict_New();
    if (dict == NULL) return NULL;
    PyObject **items = PySequence_Fast_ITEMS(fields);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = decode(c, items[i]);
        if (value == NULL) goto error;
        int failed = PyDict_SetItem(dict, PyTuple_GET_ITEM(names, i), value);
        Py_DECREF(value);
        if (failed) goto error;
    }
    return dict;
error:
    Py_DECREF(dict);
    return NULL;
}

static PyObject *decode_nested(Cursor *c, PyObject *node, long op) {
    if (c->depth >= MAX_DEPTH) return fail(c, "a value nested deeper than " Py_STRINGIFY(MAX_DEPTH) " levels");
    c->depth++;
    PyObject *value = NULL;
    if (op == OP_ARRAY) {
        value = decode_array(c, PyTuple_GET_ITEM(node, 1));
    } else if (op == OP_MAP) {
        value = decode_map(c, PyTuple_GET_ITEM(node, 1));
    } else if (op == OP_RECORD) {
        value = decode_record(c, PyTuple_GET_ITEM(node, 1), PyTuple_GET_ITEM(node, 2));
    } else { /* OP_UNION */
        int64_t branch;
        PyObject *branches = PyTuple_GET_ITEM(node, 1);
        if (read_long(c, &branch) == 0) {
            if (branch < 0 || branch >= PyTuple_GET_SIZE(branches))
                fail(c, "a union branch index out of range");
            else
                value = decode(c, PyTuple_GET_ITEM(branches, (Py_ssize_t)branch));
        }
    }
    c->depth--;
    return value;
}

static PyObject *decode(Cursor *c, PyObject *node) {
    long op = PyLong_AsLong(PyTuple_GET_ITEM(node, 0));
    int64_t n;
    Py_ssize_t size;
    const unsigned char *at;
    /* Shared values and containers charge their own; every other value is an object. */
    if (op > OP_BOOLEAN && op != OP_ENUM && op != OP_UNION && op != OP_ARRAY && op != OP_MAP &&
        op != OP_RECORD && op != OP_DECIMAL_BYTES && op != OP_DECIMAL_FIXED &&
        charge(c, COST_OBJECT) < 0)
        return NULL;
    switch (op) {
    case OP_NULL:
        Py_RETURN_NONE;
    case OP_BOOLEAN:
        if (c->p >= c->end) return fail(c, "the value ends before a boolean");
        if (*c->p > 1) return fail(c, "a boolean that is neither 0 nor 1");
        return PyBool_FromLong(*c->p++);
    case OP_INT:
        if (read_long(c, &n) < 0) return NULL;
        if (n < INT32_MIN || n > INT32_MAX) return fail(c, "an int out of 32-bit range");
        return PyLong_FromLongLong(n);
    case OP_LONG:
        if (read_long(c, &n) < 0) return NULL;
        return PyLong_FromLongLong(n);
    case OP_FLOAT:
        if ((at = read_fixed(c, 4)) == NULL) return NULL;
        return PyFloat_FromDouble(PyFloat_Unpack4((const char *)at, 1));
    case OP_DOUBLE:
        if ((at = read_fixed(c, 8)) == NULL) return NULL;
        return PyFloat_FromDouble(PyFloat_Unpack8((const char *)at, 1));
    case OP_STRING: /* up to 4 bytes a character once decoded */
        if ((at = read_sized(c, &size)) == NULL || charge(c, 4 * (long long)size) < 0) return NULL;
        return PyUnicode_DecodeUTF8((const char *)at, size, NULL);
    case OP_BYTES:
        if ((at = read_sized(c, &size)) == NULL || charge(c, size) < 0) return NULL;
        return PyBytes_FromStringAndSize((const char *)at, size);
    case OP_FIXED:
        size = PyLong_AsSsize_t(PyTuple_GET_ITEM(node, 1));
        if ((at = read_fixed(c, size)) == NULL || charge(c, size) < 0) return NULL;
        return PyBytes_FromStringAndSize((const char *)at, size);
    case OP_ENUM: {
        PyObject *symbols = PyTuple_GET_ITEM(node, 1);
        if (read_long(c, &n) < 0) return NULL;
        if (n < 0 || n >= PyTuple_GET_SIZE(symbols)) return fail(c, "an enum index out of range");
        return Py_NewRef(PyTuple_GET_ITEM(symbols, (Py_ssize_t)n));
    }
    case OP_UNION:
    case OP_ARRAY:
    case OP_MAP:
    case OP_RECORD:
        return decode_nested(c, node, op);
    case OP_DECIMAL_BYTES:
        if ((at = read_sized(c, &size)) == NULL) return NULL;
        return decimal_of(c, at, size, PyLong_AsLongLong(PyTuple_GET_ITEM(node, 1)));
    case OP_DECIMAL_FIXED:
        size = PyLong_AsSsize_t(PyTuple_GET_ITEM(node, 1));
        if ((at = read_fixed(c, size)) == NULL) return NULL;
        return decimal_of(c, at, size, PyLong_AsLongLong(PyTuple_GET_ITEM(node, 2)));
    case OP_DATE:
        if (read_long(c, &n) < 0) return NULL;
        return date_of(c, n);
    case OP_TIME_MILLIS:
        if (read_long(c, &n) < 0) return NULL;
        if (n < 0 || n >= MICROS_PER_DAY / 1000) return fail(c, "a time of day out of range");
        return time_of(c, n * 1000);
    case OP_TIME_MICROS:
        if (read_long(c, &n) < 0) return NULL;
        return time_of(c, n);
    case OP_TIMESTAMP_MILLIS:
    case OP_LOCAL_TIMESTAMP_MILLIS: {
        int64_t micros;
        if (read_long(c, &n) < 0 || millis_to_micros(c, n, &micros) < 0) return NULL;
        return timestamp_of(c, micros, op == OP_TIMESTAMP_MILLIS);
    }
    case OP_TIMESTAMP_MICROS:
    case OP_LOCAL_TIMESTAMP_MICROS:
        if (read_long(c, &n) < 0) return NULL;
        return timestamp_of(c, n, op == OP_TIMESTAMP_MICROS);
    default: /* only a compiler bug makes one; still the reader's one error */
        PyErr_Format(PyExc_ValueError, "unknown Avro opcode %ld", op);
        return NULL;
    }
}

PyDoc_STRVAR(decode_rows_doc,
"decode_rows(values, skip, fields, template, limit)\n--\n\n"
"One tuple per value of the list `values` (bytes): the body after `skip` header bytes read by\n"
"`fields`, a tuple of (node, column) in the writer schema's order, each value put at its\n"
"column of a copy of `template` (column -1: read and dropped). ValueError when a value does\n"
"not read to its last byte, nests deeper than MAX_DEPTH, or decodes to more than `limit` bytes.");

static PyObject *decode_rows(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyList_Check(args[0]) || !PyTuple_Check(args[2]) || !PyTuple_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "decode_rows(list, int, tuple, tuple, int)");
        return NULL;
    }
    long long limit = PyLong_AsLongLong(args[4]);
    if (limit < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a negative limit");
        return NULL;
    }
    PyObject *values = args[0], *fields = args[2], *template = args[3];
    Py_ssize_t skip = PyLong_AsSsize_t(args[1]);
    if (skip < 0 && PyErr_Occurred()) return NULL;
    Py_ssize_t count = PyList_GET_SIZE(values);
    Py_ssize_t width = PyTuple_GET_SIZE(template);
    Py_ssize_t field_count = PyTuple_GET_SIZE(fields);
    PyObject *rows = PyList_New(count);
    if (rows == NULL) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *value = PyList_GET_ITEM(values, i);
        if (!PyBytes_Check(value)) {
            PyErr_SetString(PyExc_TypeError, "a value that is not bytes");
            goto error;
        }
        const unsigned char *bytes = (const unsigned char *)PyBytes_AS_STRING(value);
        Py_ssize_t length = PyBytes_GET_SIZE(value);
        if (length < skip) {
            PyErr_SetString(PyExc_ValueError, "a value shorter than its header");
            goto error;
        }
        Cursor c = {bytes + skip, bytes + skip, bytes + length, 0, limit, limit};
        PyObject *row = PyTuple_New(width);
        if (row == NULL) goto error;
        for (Py_ssize_t k = 0; k < width; k++) PyTuple_SET_ITEM(row, k, Py_NewRef(PyTuple_GET_ITEM(template, k)));
        PyList_SET_ITEM(rows, i, row);
        for (Py_ssize_t f = 0; f < field_count; f++) {
            PyObject *field = PyTuple_GET_ITEM(fields, f);
            PyObject *read = decode(&c, PyTuple_GET_ITEM(field, 0));
            if (read == NULL) goto error;
            Py_ssize_t column = PyLong_AsSsize_t(PyTuple_GET_ITEM(field, 1));
            if (column < 0 || column >= width) {
                Py_DECREF(read); /* a field no column takes */
            } else {
                PyObject *before = PyTuple_GET_ITEM(row, column);
                PyTuple_SET_ITEM(row, column, read);
                Py_DECREF(before);
            }
        }
        if (c.p != c.end) {
            PyErr_Format(PyExc_ValueError, "%zd byte(s) after the record", (Py_ssize_t)(c.end - c.p));
            goto error;
        }
    }
    return rows;
error:
    Py_DECREF(rows); /* a list not yet filled holds NULLs, which it skips */
    return NULL;
}

static PyMethodDef methods[] = {
    {"decode_rows", (PyCFunction)(void (*)(void))decode_rows, METH_FASTCALL, decode_rows_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "consumers.decoding._avro_body", "Avro bodies to table rows, in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__avro_body(void) {
    PyDateTime_IMPORT;
    if (PyDateTimeAPI == NULL) return NULL;
    PyObject *decimal = PyImport_ImportModule("decimal");
    if (decimal == NULL) return NULL;
    decimal_type = PyObject_GetAttrString(decimal, "Decimal");
    Py_DECREF(decimal);
    if (decimal_type == NULL) return NULL;
    int_from_bytes = PyObject_GetAttrString((PyObject *)&PyLong_Type, "from_bytes");
    if (int_from_bytes == NULL) return NULL;
    big_signed = Py_BuildValue("(s)", "big");
    signed_kwargs = Py_BuildValue("{s:O}", "signed", Py_True);
    if (big_signed == NULL || signed_kwargs == NULL) return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module != NULL && PyModule_AddIntConstant(module, "MAX_DEPTH", MAX_DEPTH) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
