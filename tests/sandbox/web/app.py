# The web template's server (tests/sandbox/web/spec.toml): one answer on port 8000.
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"hello from the web template\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.ThreadingHTTPServer(("0.0.0.0", 8000), H).serve_forever()
