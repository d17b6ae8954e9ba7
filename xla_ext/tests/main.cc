#include "check.h"

int main(int argc, char** argv) { return check::Main(argc, argv); }
