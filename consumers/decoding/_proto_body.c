/* Protobuf bodies of plain scalar fields to table rows, in one C loop per batch.
 *
 * Ours, not a library's: the protobuf runtime parses a body in C, but into a message object,
 * whose fields Python then reads one call at a time (0.761x of JSON,
 * bench/results/typed-20261127T113817Z.json); no library turns a body straight into a tuple of
 * a table's columns. This reader takes only what is simple to read exactly as the runtime
 * (upb) does, and declines the rest, which the runtime then reads:
 *
 * - the fields it reads are proto3 scalars without presence, not repeated, not enums
 *   (consumers/decoding/proto_schemas.py chooses them): a field's last occurrence wins, an
 *   absent one keeps the template's value (its default);
 * - the message's other fields are checked as the runtime parses them, for a body it refuses
 *   must not become a row: text is UTF-8, a packed list's varints are whole and its fixed
 *   numbers fill it; a message-typed field (a nested message, a map, a well-known type) is
 *   declined, for the runtime parses it too;
 * - a varint is truncated as the runtime truncates it (int32, uint32, sint32 from its low 32
 *   bits; bool is any non-zero value), text must be UTF-8 (Python's strict decoder rejects
 *   what upb's validator rejects: overlong forms, surrogates, past U+10FFFF);
 * - a field of another wire type than its type's, and any field the table does not read, is
 *   skipped as an unknown field, as the runtime keeps it aside;
 * - a group (wire types 3 and 4), field number 0, a tag past 32 bits or 5 bytes, a value cut
 *   short, a varint longer than 10 bytes, text that is not UTF-8: the whole batch is declined
 *   (None), and the runtime reads it record by record, which names what is wrong.
 *
 * A body is outside input: every read is bounded by the body's end, nothing recurses, and the
 * values made are at most the body's own bytes (a string) or one number per field read.
 * tests/unit/test_proto_fuzz.py holds it to the runtime's parsing on generated and mutated
 * bodies.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Keep in step with consumers/decoding/proto_schemas.py (_KINDS). */
enum {
    K_INT32 = 1,
    K_INT64 = 2,
    K_UINT32 = 3,
    K_UINT64 = 4,
    K_SINT32 = 5,
    K_SINT64 = 6,
    K_BOOL = 7,
    K_FIXED32 = 8,
    K_SFIXED32 = 9,
    K_FLOAT = 10,
    K_FIXED64 = 11,
    K_SFIXED64 = 12,
    K_DOUBLE = 13,
    K_STRING = 14,
    K_BYTES = 15,
    K_ENUM = 16,    /* checked only: a varint */
    K_MESSAGE = 17, /* declined when present as a message (wire type 2) */
};

enum { W_VARINT = 0, W_FIXED64 = 1, W_LEN = 2, W_START_GROUP = 3, W_END_GROUP = 4, W_FIXED32 = 5 };

/* 1: read; 0: the batch is declined. */
static int varint(const unsigned char **p, const unsigned char *end, uint64_t *out) {
    uint64_t value = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (*p >= end) return 0;
        unsigned char byte = *(*p)++;
        value |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) {
            *out = value;
            return 1;
        }
    }
    return 0; /* more than 10 bytes */
}

static int wire_of(long kind) {
    switch (kind) {
    case K_FIXED32: case K_SFIXED32: case K_FLOAT: return W_FIXED32;
    case K_FIXED64: case K_SFIXED64: case K_DOUBLE: return W_FIXED64;
    case K_STRING: case K_BYTES: case K_MESSAGE: return W_LEN;
    default: return W_VARINT;
    }
}

static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const unsigned char *p) {
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

/* The value of a field of `kind` whose payload is `raw` (a varint or a fixed number) or the
 * `size` bytes at `data`; NULL with an exception set when Python cannot make it (the batch is
 * declined with the exception cleared when it is a UnicodeDecodeError). */
static PyObject *make(long kind, uint64_t raw, const unsigned char *data, Py_ssize_t size) {
    switch (kind) {
    case K_INT32: return PyLong_FromLong((int32_t)(uint32_t)raw);
    case K_INT64: return PyLong_FromLongLong((int64_t)raw);
    case K_UINT32: return PyLong_FromUnsignedLong((uint32_t)raw);
    case K_UINT64: return PyLong_FromUnsignedLongLong(raw);
    case K_SINT32: {
        uint32_t n = (uint32_t)raw;
        return PyLong_FromLong((int32_t)((n >> 1) ^ (~(n & 1) + 1)));
    }
    case K_SINT64: return PyLong_FromLongLong((int64_t)((raw >> 1) ^ (~(raw & 1) + 1)));
    case K_BOOL: return PyBool_FromLong(raw != 0);
    case K_FIXED32: return PyLong_FromUnsignedLong((uint32_t)raw);
    case K_SFIXED32: return PyLong_FromLong((int32_t)(uint32_t)raw);
    case K_FLOAT: {
        uint32_t bits = (uint32_t)raw;
        float f;
        memcpy(&f, &bits, sizeof f);
        return PyFloat_FromDouble((double)f);
    }
    case K_FIXED64: return PyLong_FromUnsignedLongLong(raw);
    case K_SFIXED64: return PyLong_FromLongLong((int64_t)raw);
    case K_DOUBLE: {
        double d;
        memcpy(&d, &raw, sizeof d);
        return PyFloat_FromDouble(d);
    }
    case K_STRING: return PyUnicode_DecodeUTF8((const char *)data, size, "strict");
    case K_BYTES: return PyBytes_FromStringAndSize((const char *)data, size);
    default:
        PyErr_SetString(PyExc_ValueError, "a field kind the reader does not know");
        return NULL;
    }
}

/* 1: the packed list of `kind` in `size` bytes at `data` parses as the runtime parses it. */
static int packed_ok(long kind, const unsigned char *data, Py_ssize_t size) {
    switch (wire_of(kind)) {
    case W_FIXED32: return size % 4 == 0;
    case W_FIXED64: return size % 8 == 0;
    case W_VARINT: {
        const unsigned char *p = data, *end = data + size;
        uint64_t ignored;
        while (p < end)
            if (!varint(&p, end, &ignored)) return 0;
        return 1;
    }
    default: return 0; /* strings, bytes and messages are never packed */
    }
}

/* 1: the body read into `row`; 0: declined (no exception); -1: an exception is set. */
static int read_body(const unsigned char *p, const unsigned char *end, PyObject *slots, PyObject *row) {
    Py_ssize_t slot_count = PyTuple_GET_SIZE(slots);
    Py_ssize_t width = PyTuple_GET_SIZE(row);
    while (p < end) {
        uint64_t tag;
        const unsigned char *tag_at = p;
        /* A tag is a 32-bit varint to the runtime: a longer one is its to judge. */
        if (!varint(&p, end, &tag) || p - tag_at > 5 || tag > UINT32_MAX) return 0;
        uint64_t number = tag >> 3;
        int wire = (int)(tag & 7);
        if (number == 0) return 0;
        uint64_t raw = 0;
        const unsigned char *data = NULL;
        Py_ssize_t size = 0;
        switch (wire) {
        case W_VARINT:
            if (!varint(&p, end, &raw)) return 0;
            break;
        case W_FIXED64:
            if (end - p < 8) return 0;
            raw = le64(p);
            p += 8;
            break;
        case W_FIXED32:
            if (end - p < 4) return 0;
            raw = le32(p);
            p += 4;
            break;
        case W_LEN: {
            uint64_t length;
            if (!varint(&p, end, &length) || length > (uint64_t)(end - p)) return 0;
            data = p;
            size = (Py_ssize_t)length;
            p += length;
            break;
        }
        default:
            return 0; /* groups, and the wire types no encoder writes */
        }
        if ((Py_ssize_t)number >= slot_count) continue; /* not in the schema: kept aside */
        PyObject *slot = PyTuple_GET_ITEM(slots, (Py_ssize_t)number);
        if (slot == Py_None) continue;
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(slot, 0));
        Py_ssize_t column = PyLong_AsSsize_t(PyTuple_GET_ITEM(slot, 1));
        long repeated = PyLong_AsLong(PyTuple_GET_ITEM(slot, 2));
        if (PyErr_Occurred()) return -1;
        if (repeated && wire == W_LEN && wire_of(kind) != W_LEN) {
            if (!packed_ok(kind, data, size)) return 0;
            continue;
        }
        if (wire != wire_of(kind)) continue; /* the runtime keeps it as an unknown field */
        if (kind == K_MESSAGE) return 0;
        if (column < 0) { /* a field no column takes: only what the runtime would refuse */
            if (kind == K_STRING) {
                PyObject *text = PyUnicode_DecodeUTF8((const char *)data, size, "strict");
                if (text == NULL) {
                    if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return -1;
                    PyErr_Clear();
                    return 0;
                }
                Py_DECREF(text);
            }
            continue;
        }
        if (column >= width) {
            PyErr_SetString(PyExc_ValueError, "a field's column past the row");
            return -1;
        }
        PyObject *value = make(kind, raw, data, size);
        if (value == NULL) {
            if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                PyErr_Clear();
                return 0;
            }
            return -1;
        }
        PyObject *before = PyTuple_GET_ITEM(row, column);
        PyTuple_SET_ITEM(row, column, value);
        Py_DECREF(before);
    }
    return 1;
}

PyDoc_STRVAR(decode_rows_doc,
"decode_rows(values, skip, slots, template)\n--\n\n"
"One tuple per value of the list `values` (bytes): the body after `skip` header bytes, each\n"
"field it has a slot for put at the slot's column of a copy of `template`. `slots`: a tuple\n"
"indexed by field number, each None (not in the schema) or (kind, column, repeated), column\n"
"-1 for a field checked only. None when any body holds what this reader declines (see the\n"
"module's comment): the runtime reads those.");

static PyObject *decode_rows(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyList_Check(args[0]) || !PyTuple_Check(args[2]) || !PyTuple_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "decode_rows(list, int, tuple, tuple)");
        return NULL;
    }
    PyObject *values = args[0], *slots = args[2], *template = args[3];
    Py_ssize_t skip = PyLong_AsSsize_t(args[1]);
    if (skip < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a negative skip");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(values);
    Py_ssize_t width = PyTuple_GET_SIZE(template);
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
        if (length < skip) goto declined;
        PyObject *row = PyTuple_New(width);
        if (row == NULL) goto error;
        for (Py_ssize_t k = 0; k < width; k++) PyTuple_SET_ITEM(row, k, Py_NewRef(PyTuple_GET_ITEM(template, k)));
        PyList_SET_ITEM(rows, i, row);
        int read = read_body(bytes + skip, bytes + length, slots, row);
        if (read < 0) goto error;
        if (read == 0) goto declined;
    }
    return rows;
declined:
    Py_DECREF(rows);
    Py_RETURN_NONE;
error:
    Py_DECREF(rows);
    return NULL;
}

static PyMethodDef methods[] = {
    {"decode_rows", (PyCFunction)(void (*)(void))decode_rows, METH_FASTCALL, decode_rows_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_proto_body",
    "Protobuf bodies of plain scalar fields to table rows, in one C loop per batch.", -1, methods,
};

PyMODINIT_FUNC PyInit__proto_body(void) { return PyModule_Create(&module); }
