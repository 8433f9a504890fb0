// HTTPServer: see the module's issue; this file is replaced as the module lands.
