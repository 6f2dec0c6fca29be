#!/bin/bash
# One HTTP/1.0 GET over bash's /dev/tcp (no curl needed in the image): get.sh PORT PATH
exec 3<>/dev/tcp/127.0.0.1/$1 || exit 7
printf 'GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n' "$2" >&3
cat <&3
