# from the repository root, after `make lib` (build/libnexar.so)
cc -std=c11 -Iinclude docs/samples/hello.c -Lbuild -lnexar -Wl,-rpath,"$PWD/build" -o build/hello
c++ -std=c++17 -Iinclude -Ibindings/cpp/include docs/samples/ring.cpp -Lbuild -lnexar \
    -Wl,-rpath,"$PWD/build" -o build/ring
build/nexar run -n 2 -- build/hello
build/nexar run -n 2 -- build/ring
