#!/usr/bin/env python3
"""Derive envd's .proto files from the descriptors the `e2b` SDK carries.

The e2b Python SDK ships its envd messages as generated modules
(`e2b/envd/process/process_pb.py`, `e2b/envd/filesystem/filesystem_pb.py`), each
holding the serialized FileDescriptorProto of the file it was generated from.
Those descriptors are what the SDK puts on the wire, so spore's envd is built
from them: this script reads the bytes out of the modules (without importing
them), decodes them with Google's protobuf runtime and prints proto3 source.

    python3 tools/envd-proto/derive.py SITE_PACKAGES OUT_DIR

Run it by hand when the pinned SDK moves (tests/serve/requirements.txt); the
output is committed under crates/spore-guest-tools/proto/ and compiled by
prost at build time. Needs `protobuf` (Google's) in the running Python.
"""
import ast
import os
import sys

from google.protobuf import descriptor_pb2 as pb

SOURCES = ["e2b/envd/process/process_pb.py", "e2b/envd/filesystem/filesystem_pb.py"]

SCALARS = {
    pb.FieldDescriptorProto.TYPE_DOUBLE: "double",
    pb.FieldDescriptorProto.TYPE_FLOAT: "float",
    pb.FieldDescriptorProto.TYPE_INT64: "int64",
    pb.FieldDescriptorProto.TYPE_UINT64: "uint64",
    pb.FieldDescriptorProto.TYPE_INT32: "int32",
    pb.FieldDescriptorProto.TYPE_FIXED64: "fixed64",
    pb.FieldDescriptorProto.TYPE_FIXED32: "fixed32",
    pb.FieldDescriptorProto.TYPE_BOOL: "bool",
    pb.FieldDescriptorProto.TYPE_STRING: "string",
    pb.FieldDescriptorProto.TYPE_BYTES: "bytes",
    pb.FieldDescriptorProto.TYPE_UINT32: "uint32",
    pb.FieldDescriptorProto.TYPE_SFIXED32: "sfixed32",
    pb.FieldDescriptorProto.TYPE_SFIXED64: "sfixed64",
    pb.FieldDescriptorProto.TYPE_SINT32: "sint32",
    pb.FieldDescriptorProto.TYPE_SINT64: "sint64",
}


def descriptor_bytes(module_path):
    """The first bytes literal passed to file_desc(...) in a generated module."""
    tree = ast.parse(open(module_path, encoding="utf-8").read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "file_desc":
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, bytes):
                return arg.value
    raise SystemExit(f"derive: no file_desc(...) descriptor in {module_path}")


def type_name(field, package):
    if field.type in SCALARS:
        return SCALARS[field.type]
    name = field.type_name.lstrip(".")
    prefix = package + "."
    return name[len(prefix):] if name.startswith(prefix) else name


def render_enum(enum, indent):
    out = [f"{indent}enum {enum.name} {{"]
    for value in enum.value:
        out.append(f"{indent}  {value.name} = {value.number};")
    out.append(f"{indent}}}")
    return out


def render_message(msg, package, indent):
    out = [f"{indent}message {msg.name} {{"]
    inner = indent + "  "
    maps = {n.name: n for n in msg.nested_type if n.options.map_entry}
    for nested in msg.nested_type:
        if not nested.options.map_entry:
            out += render_message(nested, package, inner)
    for enum in msg.enum_type:
        out += render_enum(enum, inner)

    def field_line(field, pad):
        tname = type_name(field, package)
        entry = maps.get(tname.split(".")[-1]) if field.type == field.TYPE_MESSAGE else None
        if entry is not None and field.label == field.LABEL_REPEATED:
            key, value = entry.field[0], entry.field[1]
            decl = f"map<{type_name(key, package)}, {type_name(value, package)}>"
        elif field.label == field.LABEL_REPEATED:
            decl = f"repeated {tname}"
        elif field.proto3_optional:
            decl = f"optional {tname}"
        else:
            decl = tname
        return f"{pad}{decl} {field.name} = {field.number};"

    real_oneofs = {}
    for field in msg.field:
        if field.HasField("oneof_index") and not field.proto3_optional:
            real_oneofs.setdefault(field.oneof_index, []).append(field)
    emitted = set()
    for field in msg.field:
        if field.HasField("oneof_index") and not field.proto3_optional:
            if field.oneof_index in emitted:
                continue
            emitted.add(field.oneof_index)
            out.append(f"{inner}oneof {msg.oneof_decl[field.oneof_index].name} {{")
            for member in real_oneofs[field.oneof_index]:
                out.append(field_line(member, inner + "  "))
            out.append(f"{inner}}}")
        else:
            out.append(field_line(field, inner))
    out.append(f"{indent}}}")
    return out


def render_file(fd):
    out = [
        "// Derived by tools/envd-proto/derive.py from the descriptor the e2b SDK",
        "// carries; do not edit by hand.",
        'syntax = "proto3";',
        "",
        f"package {fd.package};",
        "",
    ]
    for dep in fd.dependency:
        out.append(f'import "{dep}";')
    if fd.dependency:
        out.append("")
    for enum in fd.enum_type:
        out += render_enum(enum, "") + [""]
    for msg in fd.message_type:
        out += render_message(msg, fd.package, "") + [""]
    for service in fd.service:
        out.append(f"service {service.name} {{")
        for method in service.method:
            req = ("stream " if method.client_streaming else "") + type_name(
                pb.FieldDescriptorProto(type_name=method.input_type, type=11), fd.package)
            res = ("stream " if method.server_streaming else "") + type_name(
                pb.FieldDescriptorProto(type_name=method.output_type, type=11), fd.package)
            out.append(f"  rpc {method.name}({req}) returns ({res});")
        out.append("}")
    return "\n".join(out).rstrip() + "\n"


def main():
    if len(sys.argv) != 3:
        raise SystemExit("usage: derive.py SITE_PACKAGES OUT_DIR")
    site, out_dir = sys.argv[1:]
    for source in SOURCES:
        fd = pb.FileDescriptorProto.FromString(descriptor_bytes(os.path.join(site, source)))
        target = os.path.join(out_dir, fd.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target + ".tmp", "w", encoding="utf-8") as f:
            f.write(render_file(fd))
        os.replace(target + ".tmp", target)
        print(target)


if __name__ == "__main__":
    main()
