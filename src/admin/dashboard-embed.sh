#!/bin/sh
# dashboard-embed.sh FILE - writes, on standard output, a C file that holds
# FILE (src/admin/dashboard.html) as admin_dashboard_html (NUL-terminated) and its
# length, for the admin port to serve.  Run by make; needs only od and sed.
set -e
file=$1
len=$(wc -c <"$file" | tr -d ' ')
echo "/* Generated from src/admin/dashboard.html by src/admin/dashboard-embed.sh: do not edit. */"
echo '#include "admin/admin.h"'
echo 'const unsigned char admin_dashboard_html[] = {'
od -An -v -tx1 "$file" | sed -e 's/ *\([0-9a-f][0-9a-f]\)/0x\1,/g' -e 's/^/   /'
echo '   0x00};'
echo "const unsigned long admin_dashboard_html_len = ${len}UL;"
