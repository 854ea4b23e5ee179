// RUN: stageml-opt %s -p requantize-merged | filecheck %s
// RUN: stageml-opt %s -p requantize-merged,bt-verify | filecheck %s
// RUN: stageml-opt %s -p requantize-merged | filecheck %s --check-prefix=GONE

// bt-improve's merge of a LoRA site into an int8 weight (a multi-tenant
// --keep-quantized compile's main program: bt-improve-columns.mlir's output,
// with the module's site): M = dequant(Q)*v + 2*A^T B^T is built at adapter
// time from the int8 weight (its cast deferred), re-quantized per output
// column as torchao does (scale = max(max|M| / 127.5, eps), q =
// clamp(round(M * (1 / scale)), -128, 127)), and the request-time product
// reads q again, scaled after the product. The adapter stage measures the
// re-quantization: [sum (q*scale - M)^2, sum (2*A^T B^T)^2] in a bt.measure
// naming the site. bt-verify accepts the result (second RUN). The static
// float copy of dequant(Q)*v bt-improve built is gone (GONE).
// GONE-NOT: {bt.time = #bt.time<"static">} : !torch.vtensor<[8,16],si8>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[8,16],f32>
// GONE: bt.measure

// CHECK-LABEL: func.func @main
// CHECK:      %[[T:[0-9]+]] = torch.aten.permute %arg0, %{{[0-9]+}} {bt.time = #bt.time<"static">}
// CHECK:      %[[D:[0-9]+]] = torch.aten.mul.Scalar %{{[0-9]+}}, %float2.000000e00 {bt.time = #bt.time<"adapter">}
// CHECK:      %[[W:[0-9]+]] = torch.aten.to.dtype %[[T]], %int6, %false, %false, %none {bt.deferred, bt.time = #bt.time<"adapter">}
// CHECK:      %[[WV:[0-9]+]] = torch.aten.mul.Tensor %[[W]], %arg1 {bt.time = #bt.time<"adapter">}
// CHECK:      %[[M:[0-9]+]] = torch.aten.add.Tensor %[[WV]], %[[D]], %{{.+}} {bt.time = #bt.time<"adapter">}
// CHECK:      %[[ABS:[0-9]+]] = torch.aten.abs %[[M]] {bt.time = #bt.time<"adapter">}
// CHECK:      %[[MAX:[a-z]+]], %{{.+}} = torch.aten.max.dim %[[ABS]], %{{.+}}, %{{.+}} {bt.time = #bt.time<"adapter">} : !torch.vtensor<[8,16],f32>, !torch.int, !torch.bool -> !torch.vtensor<[16],f32>, !torch.vtensor<[16],si64>
// CHECK:      %[[DIV:[0-9]+]] = torch.aten.div.Scalar %[[MAX]], %float1.275000e02 {bt.time = #bt.time<"adapter">}
// CHECK:      %[[S:[0-9]+]] = torch.aten.clamp %[[DIV]], %float1.192090e-07, %{{.+}} {bt.time = #bt.time<"adapter">}
// CHECK:      %[[R:[0-9]+]] = torch.aten.reciprocal %[[S]]
// CHECK:      %[[MR:[0-9]+]] = torch.aten.mul.Tensor %[[M]], %[[R]]
// CHECK:      %[[RO:[0-9]+]] = torch.aten.round %[[MR]]
// CHECK:      %[[C:[0-9]+]] = torch.aten.clamp %[[RO]], %float-1.280000e02, %float1.270000e02
// CHECK:      %[[Q:[0-9]+]] = torch.aten.to.dtype %[[C]], %{{.+}} {bt.time = #bt.time<"adapter">} : !torch.vtensor<[8,16],f32>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[8,16],si8>
// CHECK:      %[[QF:[0-9]+]] = torch.aten.to.dtype %[[Q]], %{{.+}} {bt.time = #bt.time<"adapter">} : !torch.vtensor<[8,16],si8>, {{.+}} -> !torch.vtensor<[8,16],f32>
// CHECK:      %[[P:[0-9]+]] = torch.aten.matmul %arg4, %[[QF]] {bt.time = #bt.time<"dynamic">}
// CHECK:      %[[Y:[0-9]+]] = torch.aten.mul.Tensor %[[P]], %[[S]] {bt.time = #bt.time<"dynamic">}
// CHECK:      torch.aten.sub.Tensor %{{[0-9]+}}, %[[M]], %{{.+}} {bt.time = #bt.time<"adapter">}
// CHECK:      torch.aten.mul.Tensor %[[D]], %[[D]] {bt.time = #bt.time<"adapter">}
// CHECK:      %[[E:[0-9]+]] = torch.aten.cat %{{[0-9]+}}, %{{.+}} {bt.time = #bt.time<"adapter">} : !torch.list<vtensor>, !torch.int -> !torch.vtensor<[2],f32>
// CHECK-NEXT: "bt.measure"(%[[E]]) {bt.time = #bt.time<"adapter">, name = "quantization_error.0", sites = ["fc.lora_A.default.weight"]}
// CHECK-NEXT: return %[[Y]]
module attributes {bt.sites = [{dtype = "float32", experts = 0 : i64, in_features = 8 : i64, lora_A = "fc.lora_A.default.weight", lora_B = "fc.lora_B.default.weight", out_features = 16 : i64, rank = 2 : i64, scaling = 2.000000e+00 : f64}], bt.tenants = {max_adapters = 2 : i64, max_rank = 2 : i64}} {
  func.func @main(%arg0: !torch.vtensor<[16,8],si8> {bt.name = "fc.base_layer.weight.qdata", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[16],f32> {bt.name = "fc.base_layer.weight.scale", bt.time = #bt.time<"static">}, %arg2: !torch.vtensor<[2,8],f32> {bt.name = "fc.lora_A.default.weight", bt.time = #bt.time<"adapter">}, %arg3: !torch.vtensor<[16,2],f32> {bt.name = "fc.lora_B.default.weight", bt.time = #bt.time<"adapter">}, %arg4: !torch.vtensor<[?,8],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}) -> !torch.vtensor<[?,16],f32> attributes {bt.program = "main"} {
    %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
    %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %int6 = torch.constant.int 6 {bt.time = #bt.time<"static">}
    %false = torch.constant.bool false {bt.time = #bt.time<"static">}
    %none = torch.constant.none {bt.time = #bt.time<"static">}
    %float2.000000e00 = torch.constant.float 2.000000e+00 {bt.time = #bt.time<"static">}
    %0 = torch.prim.ListConstruct %int1, %int0 {bt.time = #bt.time<"static">} : (!torch.int, !torch.int) -> !torch.list<int>
    %1 = torch.aten.permute %arg0, %0 {bt.time = #bt.time<"static">} : !torch.vtensor<[16,8],si8>, !torch.list<int> -> !torch.vtensor<[8,16],si8>
    %2 = torch.aten.to.dtype %1, %int6, %false, %false, %none {bt.time = #bt.time<"static">} : !torch.vtensor<[8,16],si8>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[8,16],f32>
    %3 = torch.aten.transpose.int %arg2, %int0, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[2,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[8,2],f32>
    %4 = torch.aten.transpose.int %arg3, %int0, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[16,2],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,16],f32>
    %5 = torch.aten.mul.Tensor %2, %arg1 {bt.time = #bt.time<"static">} : !torch.vtensor<[8,16],f32>, !torch.vtensor<[16],f32> -> !torch.vtensor<[8,16],f32>
    %6 = torch.aten.mm %3, %4 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[8,2],f32>, !torch.vtensor<[2,16],f32> -> !torch.vtensor<[8,16],f32>
    %7 = torch.aten.mul.Scalar %6, %float2.000000e00 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[8,16],f32>, !torch.float -> !torch.vtensor<[8,16],f32>
    %8 = torch.aten.add.Tensor %5, %7, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[8,16],f32>, !torch.vtensor<[8,16],f32>, !torch.int -> !torch.vtensor<[8,16],f32>
    %9 = torch.aten.matmul %arg4, %8 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,16],f32> -> !torch.vtensor<[?,16],f32>
    return %9 : !torch.vtensor<[?,16],f32>
  }
}

